"""What users get back: RequestOutput with one CompletionOutput per returned sequence (vLLM's names)."""
from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Optional

from seq2seq_engine.sequence import SequenceGroup, SequenceStatus


@dataclasses.dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: List[int]
    cumulative_logprob: Optional[float]
    logprobs: Optional[List[Dict[int, float]]]
    finish_reason: Optional[str] = None
    stop_reason: Any = None
    # Beam search only: the hypothesis' rank score, cumulative_logprob / generated_len ** length_penalty
    # (HF's sequences_scores).
    beam_score: Optional[float] = None

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclasses.dataclass
class RequestOutput:
    request_id: str
    prompt: Optional[str]
    prompt_token_ids: List[int]
    outputs: List[CompletionOutput]
    finished: bool
    encoder_prompt: Optional[str] = None
    encoder_prompt_token_ids: Optional[List[int]] = None
    ignored_reason: Optional[str] = None
    # With SamplingParams.prompt_logprobs: per decoder-prompt token, None for the first, then {token_id: logprob}
    # holding the prompt token and the top prompt_logprobs tokens (entries so far while the prompt is prefilling).
    prompt_logprobs: Optional[List[Optional[Dict[int, float]]]] = None
    # Set when the request failed inside an engine step and was aborted (the other requests of the step went on).
    error: Optional[str] = None

    @classmethod
    def from_seq_group(cls, seq_group: SequenceGroup) -> "RequestOutput":
        """Sequences ranked by cumulative logprob when several were sampled; n of them are returned. A finished
        beam search returns its beam_width hypotheses ranked by their length-penalised score."""
        seqs = seq_group.get_seqs()
        params = seq_group.sampling_params
        beam = seq_group.beam_search
        beam_scores: Dict[int, float] = {}
        if beam is not None and beam.finished:
            # The hypotheses were added to the group best first.
            beam_scores = {id(hyp.payload): hyp.score for hyp in beam.hypotheses.ranked}
        elif len(seqs) > 1:
            seqs = sorted(seqs, key=lambda seq: seq.data.cumulative_logprob, reverse=True)
        num_returned = params.n if params is not None and beam is None else len(seqs)
        want_logprobs = params is not None and params.logprobs is not None
        outputs = [
            CompletionOutput(
                index=index, text=seq.output_text, token_ids=list(seq.data.output_token_ids),
                cumulative_logprob=seq.data.cumulative_logprob,
                logprobs=list(seq.output_logprobs) if want_logprobs else None,
                finish_reason=SequenceStatus.get_finished_reason(seq.status), stop_reason=seq.stop_reason,
                beam_score=beam_scores.get(id(seq)))
            for index, seq in enumerate(seqs[:num_returned])]
        return cls(request_id=seq_group.request_id, prompt=seq_group.prompt,
                   prompt_token_ids=list(seq_group.prompt_token_ids), outputs=outputs,
                   finished=seq_group.is_finished(), encoder_prompt=seq_group.encoder_prompt,
                   encoder_prompt_token_ids=seq_group.encoder_prompt_token_ids,
                   ignored_reason=seq_group.ignored_reason, error=seq_group.error,
                   prompt_logprobs=list(seq_group.prompt_logprobs) if seq_group.prompt_logprobs is not None else None)
