"""Applies a step's sampled tokens to the scheduled sequences: append, detokenize, check stops, free."""
from __future__ import annotations

import dataclasses
from typing import Callable, Dict, List, Optional, Sequence as Seq, Tuple

from seq2seq_engine.core.scheduler import Scheduler
from seq2seq_engine.core.scheduler_outputs import SchedulerOutputs
from seq2seq_engine.engine.beam_output import BeamOutputProcessor, Candidates
from seq2seq_engine.engine.stop_checker import StopChecker
from seq2seq_engine.sampling.sampler import SamplerOutput
from seq2seq_engine.sequence import FIRST_FINISHED, Sequence, SequenceGroup, SequenceStatus
from seq2seq_engine.tokenization.detokenizer import Detokenizer


class OutputProcessor:
    def __init__(self, scheduler: Scheduler, stop_checker: StopChecker, detokenizer: Optional[Detokenizer],
                 next_seq_id: Callable[[], int]) -> None:
        self.scheduler = scheduler
        self.stop_checker = stop_checker
        self.detokenizer = detokenizer
        self.beam_processor = BeamOutputProcessor(scheduler, stop_checker, detokenizer, next_seq_id)

    def process(self, scheduler_outputs: SchedulerOutputs, sampled_seq_ids: List[int],
                sampler_output: Optional[SamplerOutput]) -> List[int]:
        """Update every scheduled request; returns the ids of sequences that finished this step."""
        row_of_seq = {seq_id: row for row, seq_id in enumerate(sampled_seq_ids)}
        if sampler_output is not None:
            sampler_output = sampler_output.to_host()  # one wait for the device, not one per column read below
        columns = SampledColumns.from_output(sampler_output)
        beam_candidates = _beam_candidates(sampler_output, sampled_seq_ids)
        prompt_chunks = _prompt_logprob_chunks(sampler_output)
        finished_seq_ids = []
        for scheduled in scheduler_outputs.scheduled_seq_groups:
            seq_group = scheduled.seq_group
            single = self._process_single(seq_group, scheduled.token_chunk_size, row_of_seq, columns, prompt_chunks)
            if single is not None:
                if single.status >= FIRST_FINISHED:
                    self.scheduler.free_seq(single)
                    finished_seq_ids.append(single.seq_id)
                continue
            seq_group.update_num_computed_tokens(scheduled.token_chunk_size)
            if seq_group.request_id in prompt_chunks:
                _extend_prompt_logprobs(seq_group, *prompt_chunks[seq_group.request_id])
            if seq_group.beam_search is not None:
                finished_seq_ids.extend(self.beam_processor.process(seq_group, beam_candidates))
                continue
            for seq in seq_group.get_seqs(SequenceStatus.RUNNING):
                row = row_of_seq.get(seq.seq_id)
                if row is None:
                    continue  # a prompt chunk that does not end the prompt samples nothing
                self._append(seq, seq_group.sampling_params, columns, row)
                if seq.is_finished():
                    self.scheduler.free_seq(seq)
                    finished_seq_ids.append(seq.seq_id)
        return finished_seq_ids

    def _process_single(self, seq_group: SequenceGroup, num_computed: int, row_of_seq: Dict[int, int],
                        columns: "SampledColumns", prompt_chunks: dict) -> Optional[Sequence]:
        """The common case of `process` for a request of one running sequence without beams or prompt logprobs:
        returns that sequence, updated; None (nothing done) for any other request."""
        seqs = seq_group.seqs_dict
        if len(seqs) != 1 or seq_group.beam_search is not None or prompt_chunks:
            return None
        seq = next(iter(seqs.values()))
        if seq.status is not SequenceStatus.RUNNING:
            return None
        seq.data.update_num_computed_tokens(num_computed)
        row = row_of_seq.get(seq.seq_id)
        if row is not None:   # a prompt chunk that does not end the prompt samples nothing
            self._append(seq, seq_group.sampling_params, columns, row)
        return seq

    def _append(self, seq: Sequence, params, columns: "SampledColumns", row: int) -> None:
        token_id = columns.token_ids[row]
        if params.logprobs and columns.topk_ids is not None:
            logprobs = _logprob_entry(token_id, columns.logprobs[row], columns.topk_ids[row],
                                      columns.topk_logprobs[row], params.logprobs)
        else:
            logprobs = {token_id: columns.logprobs[row]}
        seq.append_token_id(token_id, logprobs)
        new_char_count = self.detokenizer.decode_sequence_inplace(seq, params) if self.detokenizer else 0
        self.stop_checker.maybe_stop_sequence(seq, new_char_count, params)


def _logprob_entry(token_id: int, logprob: float, topk_ids: Seq[int], topk_logprobs: Seq[float],
                   num_topk: int) -> Dict[int, float]:
    """{token_id: logprob} for the chosen (sampled or prompt) token, then the top num_topk not already in it."""
    entry = {token_id: logprob}
    for rank_token, rank_logprob in zip(topk_ids[:num_topk], topk_logprobs[:num_topk]):
        entry.setdefault(rank_token, rank_logprob)
    return entry


def _prompt_logprob_chunks(sampler_output: Optional[SamplerOutput]) -> Dict[str, Tuple[int, List[Dict[int, float]]]]:
    """Each request's prompt tokens scored this step: (index of the first one in the decoder prompt, one
    {token_id: logprob} entry per token), keyed by request id."""
    out = sampler_output.prompt_logprobs if sampler_output is not None else None
    if out is None:
        return {}
    token_ids, logprobs = out.token_ids.tolist(), out.token_logprobs.tolist()
    has_topk = out.topk_token_ids is not None
    topk_ids = out.topk_token_ids.tolist() if has_topk else None
    topk_logprobs = out.topk_logprobs.tolist() if has_topk else None
    chunks, row = {}, 0
    for request_id, first, count, num_topk in zip(out.request_ids, out.first_token_indices, out.num_tokens,
                                                  out.num_topk):
        chunks[request_id] = (first, [
            _logprob_entry(token_ids[r], logprobs[r], topk_ids[r] if num_topk else (),
                           topk_logprobs[r] if num_topk else (), num_topk)
            for r in range(row, row + count)])
        row += count
    return chunks


def _extend_prompt_logprobs(seq_group: SequenceGroup, first_token_index: int,
                            entries: List[Dict[int, float]]) -> None:
    """Append the entries the request does not hold yet: a prompt scored again keeps its first logprobs."""
    held = seq_group.prompt_logprobs
    if held is None:
        return
    if first_token_index > len(held):
        raise AssertionError(f"request {seq_group.request_id}: prompt logprobs from token {first_token_index} "
                             f"arrived with only {len(held)} held")
    held.extend(entries[len(held) - first_token_index:])


def _beam_candidates(sampler_output: Optional[SamplerOutput], sampled_seq_ids: List[int]) -> Dict[int, Candidates]:
    """Each beam-search sequence's top candidates (token ids, log-probs), keyed by sequence id."""
    if sampler_output is None or sampler_output.beam_rows is None:
        return {}
    token_ids, logprobs = sampler_output.beam_token_ids.tolist(), sampler_output.beam_logprobs.tolist()
    return {sampled_seq_ids[row]: (token_ids[i], logprobs[i]) for i, row in enumerate(sampler_output.beam_rows)}


@dataclasses.dataclass(frozen=True)
class SampledColumns:
    """The sampler's tensors as Python lists, converted once per step; row i is sampled row i."""

    token_ids: List[int]
    logprobs: List[float]
    topk_ids: Optional[List[List[int]]] = None          # None when no row asked for logprobs
    topk_logprobs: Optional[List[List[float]]] = None

    @classmethod
    def from_output(cls, sampler_output: Optional[SamplerOutput]) -> "SampledColumns":
        if sampler_output is None:
            return cls([], [])
        has_topk = sampler_output.topk_token_ids is not None
        return cls(sampler_output.sampled_token_ids.tolist(), sampler_output.sampled_logprobs.tolist(),
                   sampler_output.topk_token_ids.tolist() if has_topk else None,
                   sampler_output.topk_logprobs.tolist() if has_topk else None)
