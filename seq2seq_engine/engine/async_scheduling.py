"""Asynchronous scheduling (vLLM's `async_scheduling`): step N+1 is scheduled and launched before step N's sampled
tokens reach the host; step N's outputs are applied after that launch, by the same code a synchronous step runs.

While a step is pending, each sequence it sampled holds a placeholder where its token will go (sequence_data.py), so
the scheduler and the runner see the length and the slots the next step needs; the runner writes the pending token
into that step's inputs from the device (worker/token_feed.py). Before the outputs are applied the placeholder is
taken back, so stop checks, detokenization and freeing see exactly what a synchronous step shows them; a request
that finishes there had one more step computed for it, which is dropped. Only steps that the pending tokens cannot
change are run ahead (core/run_ahead.py); any other step first applies the pending outputs, then runs synchronously.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, List, Optional

from seq2seq_engine.core.run_ahead import ends_by_length
from seq2seq_engine.core.scheduler_outputs import SchedulerOutputs
from seq2seq_engine.outputs import RequestOutput
from seq2seq_engine.sampling.sampler import SamplerOutput
from seq2seq_engine.sequence import Sequence, SequenceGroup, SequenceStatus
from seq2seq_engine.worker.token_feed import TokenFeed


@dataclasses.dataclass
class LaunchedStep:
    """A step scheduled and run whose outputs are not applied yet."""

    scheduler_outputs: SchedulerOutputs
    sampled_seq_ids: List[int]
    sampler_output: Optional[SamplerOutput]
    failed_groups: List[SequenceGroup]


@dataclasses.dataclass
class _Pending:
    step: LaunchedStep
    seqs: List[Sequence]        # the sequences whose token this step sampled, still running when it was launched
    feed: TokenFeed             # the tokens of those holding a placeholder for it


Launch = Callable[[Optional[TokenFeed]], LaunchedStep]
Finish = Callable[[LaunchedStep, bool], List[RequestOutput]]
WriteTokens = Callable[[List[int], List[int], List[int]], None]


class AsyncScheduling:
    """Runs the engine's steps one ahead where it can: `step` launches the next step, then applies the one before."""

    def __init__(self, launch: Launch, finish: Finish, can_schedule_ahead: Callable[[], bool],
                 write_tokens: WriteTokens, max_model_len: int) -> None:
        self._launch = launch
        self._finish = finish
        self._can_schedule_ahead = can_schedule_ahead
        self._write_tokens = write_tokens
        self._max_model_len = max_model_len
        self._pending: Optional[_Pending] = None
        self.steps_ahead = 0    # steps launched before the step before them was applied

    @property
    def has_pending(self) -> bool:
        return self._pending is not None

    def step(self, finished_only: bool) -> List[RequestOutput]:
        """The outputs of the step before (a step launched ahead is applied at the next call), then of this step
        when it cannot run ahead."""
        if not self._can_schedule_ahead():
            outputs = self._apply_pending(finished_only)
            return outputs + self._finish(self._launch(None), finished_only)
        pending = self._pending
        launched = self._launch(pending.feed if pending is not None else None)
        self.steps_ahead += pending is not None
        outputs = self._apply_pending(finished_only)
        if launched.sampler_output is None or not launched.sampled_seq_ids:
            return outputs + self._finish(launched, finished_only)   # nothing sampled: nothing to run ahead of
        self._pending = self._run_ahead(launched)
        return outputs

    def forget(self, seq_ids) -> None:
        """Sequences about to be aborted give back their placeholder (what is reported of them holds real tokens)."""
        if self._pending is not None:
            seq_ids = set(seq_ids)
            for seq in self._pending.seqs:
                if seq.seq_id in seq_ids:
                    seq.data.drop_placeholder()

    def _run_ahead(self, launched: LaunchedStep) -> _Pending:
        """Give each sequence the step sampled for, still running, a placeholder for its token, unless that token
        is its last (a length cap): the next step then runs its last known token again, and drops the result."""
        output = launched.sampler_output
        seqs, fed = [], []
        for scheduled in launched.scheduler_outputs.scheduled_seq_groups:
            seq = scheduled.seq_group.first_seq
            if seq.status is SequenceStatus.RUNNING:
                seqs.append(seq)
                if not ends_by_length(seq, scheduled.seq_group.sampling_params, self._max_model_len):
                    seq.data.append_placeholder()
                    fed.append(seq.seq_id)
        row_of_seq = {seq_id: row for row, seq_id in enumerate(launched.sampled_seq_ids)}
        feed = TokenFeed(output.sampled_token_ids, {seq_id: row_of_seq[seq_id] for seq_id in fed})
        launched.sampler_output = output.start_host_copy()
        return _Pending(launched, seqs, feed)

    def _apply_pending(self, finished_only: bool) -> List[RequestOutput]:
        """The pending step's outputs, applied as a synchronous step applies them; its sequences that finished in
        the step before are dropped from it."""
        pending, self._pending = self._pending, None
        if pending is None:
            return []
        live = set()
        for seq in pending.seqs:
            seq.data.drop_placeholder()
            if seq.status is SequenceStatus.RUNNING:
                live.add(seq.seq_id)
        step = pending.step
        kept = [s for s in step.scheduler_outputs.scheduled_seq_groups if s.seq_group.first_seq.seq_id in live]
        step.scheduler_outputs = dataclasses.replace(step.scheduler_outputs, scheduled_seq_groups=kept)
        outputs = self._finish(step, finished_only)
        applied = [s.seq_group.first_seq for s in kept]
        self._write_tokens([seq.seq_id for seq in applied], [seq.get_len() - 1 for seq in applied],
                           [seq.get_last_token_id() for seq in applied])
        return outputs
