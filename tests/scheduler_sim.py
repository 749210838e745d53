"""A stand-in for the engine loop in scheduler tests: runs schedule() steps with fake sampled tokens."""
from __future__ import annotations

import dataclasses
import itertools
from typing import Dict, List, Optional

from seq2seq_engine.config import CacheConfig, SchedulerConfig
from seq2seq_engine.core.scheduler import Scheduler
from seq2seq_engine.inputs.data import EncoderDecoderInputs, SingletonInputs
from seq2seq_engine.sampling_params import SamplingParams
from seq2seq_engine.sequence import Sequence, SequenceGroup, SequenceStatus


def make_group(request_id: str, decoder_len: int, encoder_len: int, block_size: int, max_tokens: int,
               seq_ids: itertools.count, arrival_time: float = 0.0, priority: int = 0) -> SequenceGroup:
    """A request with `decoder_len` prompt tokens and, when encoder_len > 0, an encoder sequence."""
    decoder = SingletonInputs(prompt_token_ids=[7] * decoder_len)
    encoder = SingletonInputs(prompt_token_ids=[5] * encoder_len) if encoder_len else None
    inputs = EncoderDecoderInputs(decoder=decoder, encoder=encoder)
    seq = Sequence(next(seq_ids), decoder, block_size)
    encoder_seq = Sequence(next(seq_ids), encoder, block_size) if encoder else None
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    return SequenceGroup(request_id, [seq], arrival_time, params, encoder_seq, inputs, priority)


def make_scheduler(num_gpu_blocks: int = 16, num_cpu_blocks: int = 16, block_size: int = 4,
                   **scheduler_kwargs) -> Scheduler:
    scheduler_kwargs.setdefault("max_model_len", 64)
    scheduler_kwargs.setdefault("max_encoder_len", 64)
    scheduler_kwargs.setdefault("max_num_batched_tokens", 128)
    cache = CacheConfig(block_size=block_size, num_gpu_blocks=num_gpu_blocks, num_cpu_blocks=num_cpu_blocks,
                        watermark=0.0)
    return Scheduler(SchedulerConfig(**scheduler_kwargs), cache)


@dataclasses.dataclass
class StepRecord:
    scheduled_ids: List[str]
    prefill_ids: List[str]
    num_batched_tokens: int
    num_encoder_tokens: int
    num_seqs: int
    preempted: int
    ignored_ids: List[str]
    cross_tables: Dict[str, Optional[List[int]]]


def run_step(scheduler: Scheduler, token_id: int = 11) -> StepRecord:
    """One engine step: schedule, 'run the model' (append one token per sampled sequence), free finished."""
    metadata_list, outputs = scheduler.schedule()
    for metadata, scheduled in zip(metadata_list, outputs.scheduled_seq_groups):
        group = scheduled.seq_group
        group.update_num_computed_tokens(scheduled.token_chunk_size)
        if not metadata.do_sample:
            continue
        for seq in group.get_seqs(SequenceStatus.RUNNING):
            seq.append_token_id(token_id, {token_id: -1.0})
            if seq.get_output_len() >= group.sampling_params.max_tokens:
                seq.status = SequenceStatus.FINISHED_LENGTH_CAPPED
                scheduler.free_seq(seq)
    record = StepRecord(
        scheduled_ids=[s.seq_group.request_id for s in outputs.scheduled_seq_groups],
        prefill_ids=[s.seq_group.request_id for s in outputs.scheduled_seq_groups[:outputs.num_prefill_groups]],
        num_batched_tokens=outputs.num_batched_tokens, num_encoder_tokens=outputs.num_encoder_tokens,
        num_seqs=sum(len(m.seq_data) for m in metadata_list), preempted=outputs.preempted,
        ignored_ids=[g.request_id for g in outputs.ignored_seq_groups],
        cross_tables={m.request_id: m.cross_block_table for m in metadata_list})
    scheduler.free_finished_seq_groups()
    return record


def run_to_completion(scheduler: Scheduler, max_steps: int = 10_000) -> List[StepRecord]:
    records = []
    while scheduler.has_unfinished_seqs():
        if len(records) >= max_steps:
            raise AssertionError(f"requests still unfinished after {max_steps} steps")
        records.append(run_step(scheduler))
    return records
