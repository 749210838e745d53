"""One beam-search step of one request with HF `generate` semantics: pure list logic, no model and no engine state.

Per step (transformers 5.x `_beam_search`): every running beam's token log-probs are added to its score; the best
`num_candidates` (beam, token) pairs over all beams are ranked; a candidate that ends its sequence (a stop token, a
stop string, or the length limit) becomes a finished hypothesis only if it ranks among the first `beam_width`, scored
`cumulative_logprob / generated_len ** length_penalty` (generated_len counts the new tokens including the last one);
the best `beam_width` candidates that do not end continue as the next running beams.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, FrozenSet, List, Optional, Sequence, Union


def num_beam_candidates(beam_width: int, num_stop_tokens: int) -> int:
    """Candidates kept per step: enough that `beam_width` of them can continue even if stop tokens rank first."""
    return max(2, 1 + num_stop_tokens) * beam_width


@dataclasses.dataclass(frozen=True)
class BeamSpec:
    """What a request's beam search needs to know about its limits."""

    beam_width: int
    length_penalty: float
    early_stopping: Union[bool, str]
    stop_token_ids: FrozenSet[int]
    max_generated_len: int      # new tokens at most: min(max_tokens, max_model_len - prompt_len)

    @property
    def num_candidates(self) -> int:
        return num_beam_candidates(self.beam_width, len(self.stop_token_ids))


@dataclasses.dataclass(frozen=True)
class BeamCandidate:
    parent: int                 # index of the running beam this candidate extends
    token_id: int
    logprob: float              # the token's log-probability
    cumulative_logprob: float   # the parent's score plus logprob


@dataclasses.dataclass
class Hypothesis:
    score: float                # cumulative_logprob / generated_len ** length_penalty
    cumulative_logprob: float
    payload: Any


class BeamHypotheses:
    """The best `beam_width` finished hypotheses of one request, kept sorted best first."""

    def __init__(self, beam_width: int, length_penalty: float) -> None:
        self.beam_width = beam_width
        self.length_penalty = length_penalty
        self.ranked: List[Hypothesis] = []

    def score(self, cumulative_logprob: float, generated_len: int) -> float:
        return cumulative_logprob / (generated_len ** self.length_penalty)

    def is_full(self) -> bool:
        return len(self.ranked) >= self.beam_width

    def worst_score(self) -> float:
        return self.ranked[-1].score

    def merge(self, new: List[Hypothesis]) -> List[Hypothesis]:
        """Keep the best beam_width of the held and the new hypotheses; returns the new ones that were kept."""
        merged = sorted(self.ranked + new, key=lambda hyp: hyp.score, reverse=True)
        self.ranked = merged[:self.beam_width]
        kept = {id(hyp) for hyp in self.ranked}
        return [hyp for hyp in new if id(hyp) in kept]


@dataclasses.dataclass
class BeamStepResult:
    next_beams: List[BeamCandidate]     # the running beams of the next step, best first
    new_hypotheses: List[Hypothesis]    # hypotheses added this step and still held (payload already made)
    done: bool                          # the request is finished: its hypotheses are the result


def rank_candidates(beam_scores: Sequence[float], token_ids: Sequence[Sequence[int]],
                    logprobs: Sequence[Sequence[float]], num_candidates: int) -> List[BeamCandidate]:
    """The best `num_candidates` (beam, token) continuations by cumulative log-prob, best first.

    Each row may hold only its own top tokens (at least num_candidates of them): the overall best
    num_candidates are always among the per-row best num_candidates. -inf (banned) tokens are never candidates.
    """
    candidates = [BeamCandidate(parent, token, logprob, score + logprob)
                  for parent, (score, row_tokens, row_logprobs) in enumerate(zip(beam_scores, token_ids, logprobs))
                  for token, logprob in zip(row_tokens, row_logprobs) if logprob > -math.inf]
    candidates.sort(key=lambda cand: cand.cumulative_logprob, reverse=True)
    return candidates[:num_candidates]


def beam_search_step(beam_scores: Sequence[float], token_ids: Sequence[Sequence[int]],
                     logprobs: Sequence[Sequence[float]], generated_len: int, spec: BeamSpec,
                     hypotheses: BeamHypotheses,
                     make_payload: Optional[Callable[[BeamCandidate], Any]] = None,
                     stops_by_text: Optional[Callable[[BeamCandidate], bool]] = None) -> BeamStepResult:
    """Advance one request by one token. `generated_len`: new tokens each running beam holds before this step.
    `make_payload(candidate)` builds what a new finished hypothesis carries (by default the candidate itself);
    `stops_by_text(candidate)` says whether the candidate's text completes a stop string (HF: a stopping
    criterion hit by the candidate)."""
    candidates = rank_candidates(beam_scores, token_ids, logprobs, spec.num_candidates)
    new_len = generated_len + 1
    at_length_limit = new_len >= spec.max_generated_len
    ends = [at_length_limit or cand.token_id in spec.stop_token_ids
            or (stops_by_text is not None and stops_by_text(cand)) for cand in candidates]
    finishing = [Hypothesis(hypotheses.score(cand.cumulative_logprob, new_len), cand.cumulative_logprob, cand)
                 for rank, (cand, end) in enumerate(zip(candidates, ends)) if end and rank < spec.beam_width]
    kept = hypotheses.merge(finishing)
    for hyp in kept:
        hyp.payload = make_payload(hyp.payload) if make_payload is not None else hyp.payload
    next_beams = [cand for cand, end in zip(candidates, ends) if not end][:spec.beam_width]
    return BeamStepResult(next_beams, kept, _is_done(next_beams, new_len, spec, hypotheses))


def _is_done(next_beams: List[BeamCandidate], new_len: int, spec: BeamSpec, hypotheses: BeamHypotheses) -> bool:
    """HF's stopping rule for one request, checked after the step."""
    if not next_beams:
        return True  # every candidate ended (the length limit) or none was allowed
    if not hypotheses.is_full():
        return False
    if spec.early_stopping is True:
        return True
    # Could the best running beam still beat the worst held hypothesis? HF's heuristic judges it at the
    # current length, or, with early_stopping="never" and a positive length penalty, at the longest length.
    never = spec.early_stopping == "never" and spec.length_penalty > 0.0
    best_len = spec.max_generated_len if never else new_len
    best_possible = next_beams[0].cumulative_logprob / (best_len ** spec.length_penalty)
    return best_possible <= hypotheses.worst_score()


@dataclasses.dataclass
class BeamSearchState:
    """A beam-search request's limits and finished hypotheses (held by its SequenceGroup)."""

    spec: BeamSpec
    hypotheses: BeamHypotheses
    finished: bool = False      # set once the hypotheses have become the request's sequences

    @classmethod
    def create(cls, spec: BeamSpec) -> "BeamSearchState":
        return cls(spec, BeamHypotheses(spec.beam_width, spec.length_penalty))
