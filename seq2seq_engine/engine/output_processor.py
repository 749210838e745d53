"""Applies a step's sampled tokens to the scheduled sequences: append, detokenize, check stops, free."""
from __future__ import annotations

from typing import Callable, Dict, List, Optional

from seq2seq_engine.core.scheduler import Scheduler
from seq2seq_engine.core.scheduler_outputs import SchedulerOutputs
from seq2seq_engine.engine.beam_output import BeamOutputProcessor, Candidates
from seq2seq_engine.sampling.sampler import SamplerOutput
from seq2seq_engine.sequence import Sequence, SequenceStatus
from seq2seq_engine.stop_checker import StopChecker
from seq2seq_engine.tokenizer import Detokenizer


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
        columns = _sampler_columns(sampler_output)
        beam_candidates = _beam_candidates(sampler_output, sampled_seq_ids)
        finished_seq_ids = []
        for scheduled in scheduler_outputs.scheduled_seq_groups:
            seq_group = scheduled.seq_group
            seq_group.update_num_computed_tokens(scheduled.token_chunk_size)
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

    def _append(self, seq: Sequence, params, columns: Dict[str, list], row: int) -> None:
        token_id = columns["token_ids"][row]
        logprobs = {token_id: columns["logprobs"][row]}
        if params.logprobs and columns["topk_ids"] is not None:
            for rank_token, rank_logprob in zip(columns["topk_ids"][row][:params.logprobs],
                                                columns["topk_logprobs"][row][:params.logprobs]):
                logprobs.setdefault(rank_token, rank_logprob)
        seq.append_token_id(token_id, logprobs)
        new_char_count = self.detokenizer.decode_sequence_inplace(seq, params) if self.detokenizer else 0
        self.stop_checker.maybe_stop_sequence(seq, new_char_count, params)


def _beam_candidates(sampler_output: Optional[SamplerOutput], sampled_seq_ids: List[int]) -> Dict[int, Candidates]:
    """Each beam-search sequence's top candidates (token ids, log-probs), keyed by sequence id."""
    if sampler_output is None or sampler_output.beam_rows is None:
        return {}
    token_ids, logprobs = sampler_output.beam_token_ids.tolist(), sampler_output.beam_logprobs.tolist()
    return {sampled_seq_ids[row]: (token_ids[i], logprobs[i]) for i, row in enumerate(sampler_output.beam_rows)}


def _sampler_columns(sampler_output: Optional[SamplerOutput]) -> Dict[str, list]:
    """Python lists of the sampler's tensors, converted once per step."""
    if sampler_output is None:
        return {"token_ids": [], "logprobs": [], "topk_ids": None, "topk_logprobs": None}
    has_topk = sampler_output.topk_token_ids is not None
    return {
        "token_ids": sampler_output.sampled_token_ids.tolist(),
        "logprobs": sampler_output.sampled_logprobs.tolist(),
        "topk_ids": sampler_output.topk_token_ids.tolist() if has_topk else None,
        "topk_logprobs": sampler_output.topk_logprobs.tolist() if has_topk else None,
    }
