"""A stand-in for the engine loop in scheduler tests: runs schedule() steps with fake sampled tokens."""
from __future__ import annotations

import dataclasses
import itertools
import random
from typing import Dict, List, Optional

from seq2seq_engine.beam_search_params import BeamSearchParams
from seq2seq_engine.config import CacheConfig, SchedulerConfig
from seq2seq_engine.core.scheduler import Scheduler
from seq2seq_engine.engine.beam_output import BeamOutputProcessor, make_beam_state
from seq2seq_engine.engine.stop_checker import StopChecker
from seq2seq_engine.inputs.data import EncoderDecoderInputs, SingletonInputs
from seq2seq_engine.sampling_params import SamplingParams
from seq2seq_engine.sequence import Sequence, SequenceGroup, SequenceStatus

EOS = 2


def make_group(request_id: str, decoder_len: int, encoder_len: int, block_size: int, max_tokens: int,
               seq_ids: itertools.count, arrival_time: float = 0.0, priority: int = 0, best_of: int = 1,
               beam_width: int = 0, max_model_len: int = 64) -> SequenceGroup:
    """A request with `decoder_len` prompt tokens and, when encoder_len > 0, an encoder sequence; with best_of > 1
    it holds best_of sampled sequences, with beam_width > 0 it is a beam search (EOS = 2 ends a beam)."""
    decoder = SingletonInputs(prompt_token_ids=[7] * decoder_len)
    encoder = SingletonInputs(prompt_token_ids=[5] * encoder_len) if encoder_len else None
    inputs = EncoderDecoderInputs(decoder=decoder, encoder=encoder)
    num_seqs = 1 if beam_width else best_of
    seqs = [Sequence(next(seq_ids), decoder, block_size) for _ in range(num_seqs)]
    encoder_seq = Sequence(next(seq_ids), encoder, block_size) if encoder else None
    if beam_width:
        beam_params = BeamSearchParams(beam_width=beam_width, max_tokens=max_tokens)
        params = beam_params.to_sampling_params()
    else:
        params = SamplingParams(n=best_of, temperature=0.0 if best_of == 1 else 1.0, max_tokens=max_tokens,
                                ignore_eos=True)
    group = SequenceGroup(request_id, seqs, arrival_time, params, encoder_seq, inputs, priority)
    if beam_width:
        group.beam_search = make_beam_state(beam_params, decoder_len, max_model_len, EOS)
    return group


def make_beam_processor(scheduler: Scheduler, seq_ids: itertools.count) -> BeamOutputProcessor:
    """The engine's beam-step processor over `scheduler`, without a model or a tokenizer."""
    stop_checker = StopChecker(scheduler.scheduler_config.max_model_len, EOS)
    return BeamOutputProcessor(scheduler, stop_checker, None, lambda: next(seq_ids))


def _random_candidates(group: SequenceGroup, rng: random.Random) -> Dict[int, tuple]:
    """Fake model output for a beam group: each running beam's top tokens (EOS among them now and then)."""
    num_candidates = group.beam_search.spec.num_candidates
    candidates = {}
    for seq in group.get_seqs(SequenceStatus.RUNNING):
        tokens = rng.sample(range(3, 40), num_candidates)
        if rng.random() < 0.3:
            tokens[rng.randrange(num_candidates)] = EOS
        logprobs = sorted((-rng.expovariate(1.0) for _ in tokens), reverse=True)
        candidates[seq.seq_id] = (tokens, logprobs)
    return candidates


def make_scheduler(num_gpu_blocks: int = 16, num_cpu_blocks: int = 16, block_size: int = 4,
                   caching: bool = False, **scheduler_kwargs) -> Scheduler:
    """A scheduler over a small pool; `caching` turns on the prefix and encoder caches (the simulated requests'
    prompts repeat, so they would share blocks)."""
    scheduler_kwargs.setdefault("max_model_len", 64)
    scheduler_kwargs.setdefault("max_encoder_len", 64)
    scheduler_kwargs.setdefault("max_num_batched_tokens", 128)
    cache = CacheConfig(block_size=block_size, num_gpu_blocks=num_gpu_blocks, num_cpu_blocks=num_cpu_blocks,
                        watermark=0.0, enable_prefix_caching=caching, enable_encoder_cache=caching)
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


def run_step(scheduler: Scheduler, token_id: int = 11, beam_processor: Optional[BeamOutputProcessor] = None,
             rng: Optional[random.Random] = None) -> StepRecord:
    """One engine step: schedule, 'run the model' (append one token per sampled sequence, or a beam step with
    random candidates for a beam group), free finished."""
    metadata_list, outputs = scheduler.schedule()
    for metadata, scheduled in zip(metadata_list, outputs.scheduled_seq_groups):
        if metadata.is_prompt:  # the runner writes a prompt once, through the table all its sequences share
            assert len({tuple(table) for table in metadata.block_tables.values()}) == 1, metadata.block_tables
        group = scheduled.seq_group
        group.update_num_computed_tokens(scheduled.token_chunk_size)
        if not metadata.do_sample:
            continue
        if group.beam_search is not None:
            beam_processor.process(group, _random_candidates(group, rng))
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
