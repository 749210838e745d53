"""Applies a beam-search step to a request: beams fork and die through the scheduler (their blocks are shared
copy-on-write and freed with the last beam holding them), tokens are appended and detokenized, finished hypotheses
are kept (a candidate whose text completes a stop string ends, as one with a stop token), and the request finishes
when HF's stopping rule says so."""
from __future__ import annotations

from collections import defaultdict
from typing import Callable, Dict, List, Optional, Tuple

from seq2seq_engine.beam_search_params import BeamSearchParams
from seq2seq_engine.core.scheduler import Scheduler
from seq2seq_engine.engine.stop_checker import StopChecker
from seq2seq_engine.sampling.beam_search import BeamCandidate, BeamSearchState, BeamSpec, beam_search_step
from seq2seq_engine.sequence import Sequence, SequenceGroup, SequenceStatus
from seq2seq_engine.tokenization.detokenizer import Detokenizer

# Per running beam: its top candidate token ids and their log-probs, best first.
Candidates = Tuple[List[int], List[float]]


def make_beam_state(params: BeamSearchParams, prompt_len: int, max_model_len: int,
                    eos_token_id: Optional[int]) -> BeamSearchState:
    """The request's beam limits: EOS (unless ignore_eos) and stop_token_ids end a beam, as HF's eos_token_id list."""
    stop_ids = set(params.stop_token_ids)
    if eos_token_id is not None and not params.ignore_eos:
        stop_ids.add(eos_token_id)
    spec = BeamSpec(beam_width=params.beam_width, length_penalty=float(params.length_penalty),
                    early_stopping=params.early_stopping, stop_token_ids=frozenset(stop_ids),
                    max_generated_len=min(params.max_tokens, max_model_len - prompt_len))
    return BeamSearchState.create(spec)


class BeamOutputProcessor:
    def __init__(self, scheduler: Scheduler, stop_checker: StopChecker, detokenizer: Optional[Detokenizer],
                 next_seq_id: Callable[[], int]) -> None:
        self.scheduler = scheduler
        self.stop_checker = stop_checker
        self.detokenizer = detokenizer
        self.next_seq_id = next_seq_id

    def process(self, seq_group: SequenceGroup, candidates_of: Dict[int, Candidates]) -> List[int]:
        """One step of a beam request; returns the ids of the sequences it dropped (their runner rows can go)."""
        beams = seq_group.get_seqs(SequenceStatus.RUNNING)
        if not beams or any(beam.seq_id not in candidates_of for beam in beams):
            return []  # a prompt chunk that does not end the prompt samples nothing
        state: BeamSearchState = seq_group.beam_search
        rows = [candidates_of[beam.seq_id] for beam in beams]
        trials: Dict[Tuple[int, int], Sequence] = {}  # (parent, token) -> the candidate, detokenized and checked
        result = beam_search_step(
            [beam.data.cumulative_logprob for beam in beams], [ids for ids, _ in rows], [lps for _, lps in rows],
            beams[0].get_output_len(), state.spec, state.hypotheses,
            make_payload=lambda cand: self._trial(seq_group, beams, cand, trials),
            stops_by_text=((lambda cand: self._stops_by_text(seq_group, beams, cand, trials))
                           if seq_group.sampling_params.stop else None))
        dropped = self._advance(seq_group, beams, result.next_beams)
        if result.done:
            dropped += self._finish(seq_group, state)
        return dropped

    def _append(self, seq: Sequence, candidate: BeamCandidate, params) -> int:
        seq.append_token_id(candidate.token_id, {candidate.token_id: candidate.logprob})
        return self.detokenizer.decode_sequence_inplace(seq, params) if self.detokenizer else 0

    def _trial(self, seq_group: SequenceGroup, beams: List[Sequence], candidate: BeamCandidate,
               trials: Dict[Tuple[int, int], Sequence]) -> Sequence:
        """A copy of the parent beam plus the candidate's token, detokenized and stop-checked; it holds no KV
        blocks. A candidate that ends becomes this finished hypothesis."""
        key = (candidate.parent, candidate.token_id)
        if key not in trials:
            trial = beams[candidate.parent].fork(self.next_seq_id())
            new_char_count = self._append(trial, candidate, seq_group.sampling_params)
            # Sets FINISHED_STOPPED (a stop token, its text dropped unless include_stop_str_in_output, or a stop
            # string, the text cut there) or FINISHED_LENGTH_CAPPED: the limits that end a candidate.
            self.stop_checker.maybe_stop_sequence(trial, new_char_count, seq_group.sampling_params)
            trials[key] = trial
        return trials[key]

    def _stops_by_text(self, seq_group: SequenceGroup, beams: List[Sequence], candidate: BeamCandidate,
                       trials: Dict[Tuple[int, int], Sequence]) -> bool:
        trial = self._trial(seq_group, beams, candidate, trials)
        return trial.status == SequenceStatus.FINISHED_STOPPED and isinstance(trial.stop_reason, str)

    def _advance(self, seq_group: SequenceGroup, beams: List[Sequence], next_beams: List[BeamCandidate]) -> List[int]:
        """Each beam continues with its first candidate, forks for the others, or is freed when it has none."""
        children = defaultdict(list)
        for candidate in next_beams:
            children[candidate.parent].append(candidate)
        dropped = []
        for index, beam in enumerate(beams):
            own = children.get(index)
            if not own:
                self.scheduler.free_seq(beam)
                seq_group.remove(beam.seq_id)
                dropped.append(beam.seq_id)
                continue
            for candidate in own[1:]:  # fork before the parent's own token is appended
                child = beam.fork(self.next_seq_id())
                self.scheduler.fork_seq(beam, child)
                seq_group.add(child)
                self._append(child, candidate, seq_group.sampling_params)
            self._append(beam, own[0], seq_group.sampling_params)
        return dropped

    def _finish(self, seq_group: SequenceGroup, state: BeamSearchState) -> List[int]:
        """The running beams go (blocks freed); the hypotheses, best first, become the request's sequences."""
        dropped = []
        for beam in seq_group.get_seqs():
            self.scheduler.free_seq(beam)
            seq_group.remove(beam.seq_id)
            dropped.append(beam.seq_id)
        for hypothesis in state.hypotheses.ranked:
            seq_group.add(hypothesis.payload)
        state.finished = True
        return dropped
