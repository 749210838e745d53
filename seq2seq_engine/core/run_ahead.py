"""Whether the next step may be scheduled before the previous step's tokens reach the host (asynchronous scheduling):
a step whose every request decodes its one sequence, exactly as a synchronous step would have scheduled it."""
from __future__ import annotations

from typing import Collection

from seq2seq_engine.sampling.logits_processors.batch import reads_history
from seq2seq_engine.sampling_params import SamplingParams
from seq2seq_engine.sequence import Sequence, SequenceGroup, SequenceStage, SequenceStatus


def decodes_ahead(group: SequenceGroup) -> bool:
    """Whether the request's next step needs nothing of the token still being sampled but its place: one running
    sequence in its decode stage, no beams, no logits processing that reads earlier tokens' values."""
    seqs = group.seqs_dict
    if len(seqs) != 1 or group.beam_search is not None:
        return False
    seq = next(iter(seqs.values()))
    if seq.status is not SequenceStatus.RUNNING or seq.data.stage is not SequenceStage.DECODE:
        return False
    return not reads_history(group.sampling_params)


def ends_by_length(seq: Sequence, params: SamplingParams, max_model_len: int) -> bool:
    """Whether the sequence's next token, whatever it is, reaches a length cap (it will be its last)."""
    return (seq.get_len() + 1 >= max_model_len
            or (params.max_tokens is not None and seq.get_output_len() + 1 >= params.max_tokens))


def can_schedule_ahead(running: Collection[SequenceGroup], num_waiting: int, num_swapped: int, num_free_blocks: int,
                       max_num_batched_tokens: int) -> bool:
    """Whether the next step is one the scheduler takes without a choice that the pending tokens could change: no
    request waiting or swapped out (their admission depends on what finishes), room for every running request's
    token (budget, and a free block each: no preemption), and every running request decoding ahead."""
    if not running or num_waiting or num_swapped:
        return False
    if len(running) > max_num_batched_tokens or len(running) > num_free_blocks:
        return False
    return all(decodes_ahead(group) for group in running)
