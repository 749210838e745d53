"""Continuous-batching scheduler: waiting/running/swapped queues, token budgets, preemption."""
from __future__ import annotations

from collections import deque
from typing import Deque, Iterable, List, Tuple, Union

from seq2seq_engine.config import CacheConfig, SchedulerConfig
from seq2seq_engine.core.block_manager import AllocStatus, BlockSpaceManager
from seq2seq_engine.core.run_ahead import can_schedule_ahead
from seq2seq_engine.core.scheduler_outputs import (AdapterBudget, ScheduledSequenceGroup, SchedulerOutputs,
                                                   SchedulingBudget, StepState, too_long_reason)
from seq2seq_engine.core.step_metadata import StepMetadata
from seq2seq_engine.sequence import Sequence, SequenceGroup, SequenceGroupMetadata, SequenceStage, SequenceStatus


class Scheduler:
    """Decides, step by step, which requests run and how many of their tokens."""

    def __init__(self, scheduler_config: SchedulerConfig, cache_config: CacheConfig) -> None:
        if cache_config.num_gpu_blocks is None or cache_config.num_cpu_blocks is None:
            raise ValueError("the scheduler needs cache_config.num_gpu_blocks and num_cpu_blocks to be set")
        self.scheduler_config = scheduler_config
        self.cache_config = cache_config
        self.block_manager = BlockSpaceManager(
            cache_config.block_size, cache_config.num_gpu_blocks, cache_config.num_cpu_blocks, cache_config.watermark,
            cache_config.enable_prefix_caching, cache_config.enable_encoder_cache, cache_config.max_cached_blocks)
        self.step_metadata = StepMetadata(self.block_manager)
        self.waiting: Deque[SequenceGroup] = deque()
        self.running: Deque[SequenceGroup] = deque()
        self.swapped: Deque[SequenceGroup] = deque()
        self.num_cumulative_preemption = 0

    # ----------------------------------------------------------------- queue management
    def add_seq_group(self, seq_group: SequenceGroup) -> None:
        self.waiting.append(seq_group)

    def has_unfinished_seqs(self) -> bool:
        return bool(self.waiting or self.running or self.swapped)

    def can_schedule_ahead(self) -> bool:
        """Whether the next step can be scheduled before the running step's tokens are known (core/run_ahead.py)."""
        config = self.scheduler_config
        return can_schedule_ahead(self.running, len(self.waiting), len(self.swapped),
                                  self.block_manager.get_num_free_gpu_blocks(), config.max_num_batched_tokens)

    def get_num_unfinished_seq_groups(self) -> int:
        return len(self.waiting) + len(self.running) + len(self.swapped)

    def reset_prefix_cache(self) -> bool:
        """Forget every cached block; False, changing nothing, while requests are unfinished."""
        return not self.has_unfinished_seqs() and self.block_manager.reset_prefix_cache()

    def abort_seq_group(self, request_id: Union[str, Iterable[str]]) -> None:
        """Finish the named requests wherever they are, returning their self and cross blocks."""
        request_ids = {request_id} if isinstance(request_id, str) else set(request_id)
        for queue in (self.waiting, self.running, self.swapped):
            aborted = [group for group in queue if group.request_id in request_ids]
            for group in aborted:
                queue.remove(group)
                for seq in group.get_unfinished_seqs():
                    seq.status = SequenceStatus.FINISHED_ABORTED
                self._free_group(group)

    def free_seq(self, seq: Sequence) -> None:
        self.block_manager.free(seq)

    def fork_seq(self, parent_seq: Sequence, child_seq: Sequence) -> None:
        self.block_manager.fork(parent_seq, child_seq)

    def free_finished_seq_groups(self) -> List[SequenceGroup]:
        """Drop finished requests from the running queue, freeing their self AND cross blocks."""
        finished, running = [], deque()
        for group in self.running:
            (finished if group.is_finished() else running).append(group)
        self.running = running
        for group in finished:
            self._free_group(group)
        return finished

    def _free_group(self, seq_group: SequenceGroup) -> None:
        self.step_metadata.forget(seq_group.request_id)
        for seq in seq_group.get_seqs():
            self.block_manager.free(seq)
        self.block_manager.free_cross(seq_group)

    def _sort_key(self, seq_group: SequenceGroup):
        priority = seq_group.priority if self.scheduler_config.policy == "priority" else 0
        return (priority, seq_group.arrival_time)

    # ----------------------------------------------------------------- the step
    def schedule(self) -> Tuple[List[SequenceGroupMetadata], SchedulerOutputs]:
        """Decodes first, then swap-ins, then new prefills, each within the step's budget."""
        config = self.scheduler_config
        state = StepState(SchedulingBudget(config.max_num_batched_tokens, config.max_num_seqs))
        self.running = deque(sorted(self.running, key=self._sort_key))
        self._schedule_running(state)
        adapters = AdapterBudget(config.max_loras, self.running)
        if state.num_preempted == 0:
            self._schedule_swapped(state, adapters)
        # After a preemption the pool is tight: admitting prefills now would only preempt them again next step.
        if not self.swapped and state.num_preempted == 0:
            self._schedule_waiting(state, adapters)
        scheduled = state.prefills + state.decodes
        outputs = SchedulerOutputs(
            scheduled_seq_groups=scheduled, num_prefill_groups=len(state.prefills),
            num_batched_tokens=state.budget.num_batched_tokens - state.num_encoder_tokens,
            num_encoder_tokens=state.num_encoder_tokens,
            blocks_to_swap_in=state.blocks_to_swap_in, blocks_to_swap_out=state.blocks_to_swap_out,
            blocks_to_copy=state.blocks_to_copy, ignored_seq_groups=state.ignored,
            preempted=state.num_preempted)
        return [self.step_metadata.build(s) for s in state.prefills] + state.decode_metadata, outputs

    def _num_new_tokens(self, seq_group: SequenceGroup, budget: SchedulingBudget, is_prefill: bool,
                        num_cached_tokens: int = 0) -> int:
        """Decoder tokens to run now: 1 per sequence when decoding, a (possibly chunked) prompt otherwise, less the
        `num_cached_tokens` admission finds in the prefix cache."""
        if not is_prefill:
            return seq_group.num_unfinished_seqs()
        num_new_tokens = seq_group.first_seq.data.get_num_uncomputed_tokens() - num_cached_tokens
        chunkable = self.scheduler_config.enable_chunked_prefill and seq_group.encoder_len == 0
        if chunkable:
            num_new_tokens = min(num_new_tokens, budget.remaining_token_budget())
        return num_new_tokens

    @staticmethod
    def _encoder_tokens(seq_group: SequenceGroup, is_prefill: bool) -> int:
        """Encoder tokens run this step: all of them at a request's (never chunked) first step."""
        return seq_group.encoder_len if is_prefill else 0

    def _schedule_running(self, state: StepState) -> None:
        kept: Deque[SequenceGroup] = deque()
        while self.running:
            seq_group = self.running.popleft()
            if self._schedule_single_decode(seq_group, state):
                kept.append(seq_group)
                continue
            # Nothing below changes whether this group is prefilling: asked once, not once per helper.
            is_prefill = seq_group.is_prefill()
            num_new_tokens = self._num_new_tokens(seq_group, state.budget, is_prefill)
            cost = num_new_tokens + self._encoder_tokens(seq_group, is_prefill)
            if num_new_tokens == 0 or not state.budget.can_schedule(cost, 0):
                kept.append(seq_group)  # Out of budget: stays running, holds its blocks, runs next step.
                state.budget.add(0, seq_group.get_max_num_running_seqs())
                continue
            fits = self.block_manager.can_append_slots(seq_group)
            while not fits and self.running:
                self._preempt(self.running.pop(), state)
                fits = self.block_manager.can_append_slots(seq_group)
            if not fits:
                self._preempt(seq_group, state)
                continue
            self._append_slots(seq_group, state, is_prefill)
            self._add_scheduled(seq_group, num_new_tokens, state, is_prefill)
            kept.append(seq_group)
        self.running = kept

    def _schedule_single_decode(self, seq_group: SequenceGroup, state: StepState) -> bool:
        """The common case of `_schedule_running` in a few operations: a request decoding its one sequence with
        room for its token. False (nothing done) for any other request, or one that needs a preemption."""
        seqs = seq_group.seqs_dict
        if len(seqs) != 1:
            return False
        seq = next(iter(seqs.values()))
        if seq.status is not SequenceStatus.RUNNING or seq.data.stage is not SequenceStage.DECODE:
            return False
        budget = state.budget
        if not budget.can_schedule(1, 0):
            budget.add(0, 1)  # out of budget: stays running, holds its blocks, runs next step
            return True
        copies = self.block_manager.append_slot(seq)
        if copies is None:
            return False
        if copies:
            state.blocks_to_copy.extend(copies)
        budget.add(1, 1)
        entry = self.step_metadata.single_decode(seq_group, seq)
        state.decodes.append(entry.scheduled)
        state.decode_metadata.append(entry.metadata)
        return True

    def _schedule_swapped(self, state: StepState, adapters: AdapterBudget) -> None:
        self.swapped = deque(sorted(self.swapped, key=self._sort_key))
        while self.swapped:
            seq_group = self.swapped[0]
            status = self.block_manager.can_swap_in(seq_group)
            if status == AllocStatus.LATER or not adapters.admits(seq_group):
                break
            if status == AllocStatus.NEVER:
                self.swapped.popleft()
                self._ignore(seq_group, "its blocks no longer fit in the device KV cache", state)
                continue
            is_prefill = seq_group.is_prefill()
            num_new_tokens = self._num_new_tokens(seq_group, state.budget, is_prefill)
            if num_new_tokens == 0 or not state.budget.can_schedule(
                    num_new_tokens, seq_group.get_max_num_running_seqs()):
                break
            self.swapped.popleft()
            adapters.add(seq_group)
            state.blocks_to_swap_in.extend(self.block_manager.swap_in(seq_group))
            for seq in seq_group.get_seqs(SequenceStatus.SWAPPED):
                seq.status = SequenceStatus.RUNNING
            self._append_slots(seq_group, state, is_prefill)
            self._add_scheduled(seq_group, num_new_tokens, state, is_prefill)
            self.running.append(seq_group)

    def _schedule_waiting(self, state: StepState, adapters: AdapterBudget) -> None:
        self.waiting = deque(sorted(self.waiting, key=self._sort_key))
        held_back: Deque[SequenceGroup] = deque()     # requests whose adapter waits for a slot: the rest go on
        while self.waiting:
            seq_group = self.waiting[0]
            reason = too_long_reason(self.scheduler_config, seq_group)
            if reason is None and self.block_manager.can_allocate(seq_group) == AllocStatus.NEVER:
                reason = "it needs more KV-cache blocks than the whole device pool holds"
            if reason is not None:
                self.waiting.popleft()
                self._ignore(seq_group, reason, state)
                continue
            if not adapters.admits(seq_group):
                held_back.append(self.waiting.popleft())
                continue
            if self.block_manager.can_allocate(seq_group) == AllocStatus.LATER:
                break
            is_prefill = seq_group.is_prefill()
            num_new_tokens = self._num_new_tokens(seq_group, state.budget, is_prefill,
                                                  self.block_manager.num_cached_prefix_tokens(seq_group))
            runs_encoder = self.block_manager.runs_encoder(seq_group)
            cost = num_new_tokens + (seq_group.encoder_len if runs_encoder else 0)
            if num_new_tokens == 0 or not state.budget.can_schedule(cost, seq_group.get_max_num_running_seqs()):
                break
            self.waiting.popleft()
            adapters.add(seq_group)
            self.block_manager.allocate(seq_group)
            for seq in seq_group.get_seqs(SequenceStatus.WAITING):
                seq.status = SequenceStatus.RUNNING
            self._add_scheduled(seq_group, num_new_tokens, state, is_prefill, runs_encoder)
            self.running.append(seq_group)
        self.waiting.extendleft(reversed(held_back))

    def _ignore(self, seq_group: SequenceGroup, reason: str, state: StepState) -> None:
        seq_group.ignored_reason = reason
        for seq in seq_group.get_unfinished_seqs():
            seq.status = SequenceStatus.FINISHED_IGNORED
        self._free_group(seq_group)
        state.ignored.append(seq_group)

    def _append_slots(self, seq_group: SequenceGroup, state: StepState, is_prefill: bool) -> None:
        if is_prefill:
            # A prompt's blocks are all allocated at admission, shared by its sequences (n/best_of) and written
            # through the first one's table: copy-on-write now would leave the others with unwritten copies.
            return
        for seq in seq_group.get_seqs(SequenceStatus.RUNNING):
            state.blocks_to_copy.extend(self.block_manager.append_slots(seq))

    def _add_scheduled(self, seq_group: SequenceGroup, num_new_tokens: int, state: StepState,
                       is_prompt: bool, runs_encoder: bool = True) -> None:
        encoder_tokens = self._encoder_tokens(seq_group, is_prompt) if runs_encoder else 0
        state.num_encoder_tokens += encoder_tokens
        # A decoding group runs as many sequences as it has unfinished ones (get_max_num_running_seqs).
        num_seqs = seq_group.get_max_num_running_seqs() if is_prompt else seq_group.num_unfinished_seqs()
        state.budget.add(num_new_tokens + encoder_tokens, num_seqs)
        chunk = num_new_tokens if is_prompt else 1
        scheduled = ScheduledSequenceGroup(seq_group, chunk, is_prompt)
        if is_prompt:
            state.prefills.append(scheduled)
        else:
            state.decodes.append(scheduled)
            state.decode_metadata.append(self.step_metadata.build(scheduled))

    # ----------------------------------------------------------------- preemption
    def _preempt(self, seq_group: SequenceGroup, state: StepState) -> None:
        """Recompute a single-sequence request; swap a multi-sequence one (its beams cannot be re-derived)."""
        state.num_preempted += 1
        self.num_cumulative_preemption += 1
        # Only a request that has, and will have, one sequence is recomputed: re-admission gives every waiting
        # sequence one shared prompt table, which is wrong for diverged ones (n/best_of, beams, finished siblings).
        single = seq_group.num_seqs() == 1 and seq_group.get_max_num_running_seqs() == 1
        if single and self.scheduler_config.preemption_mode == "recompute":
            self._preempt_by_recompute(seq_group)
        elif self.block_manager.can_swap_out(seq_group):
            state.blocks_to_swap_out.extend(self.block_manager.swap_out(seq_group))
            for seq in seq_group.get_seqs(SequenceStatus.RUNNING):
                seq.status = SequenceStatus.SWAPPED
            self.swapped.append(seq_group)
        elif single:
            self._preempt_by_recompute(seq_group)
        else:
            self._ignore(seq_group, "preempted with no CPU swap space left for its sequences", state)

    def _preempt_by_recompute(self, seq_group: SequenceGroup) -> None:
        for seq in seq_group.get_seqs(SequenceStatus.RUNNING):
            seq.status = SequenceStatus.WAITING
            self.block_manager.free(seq)
            seq.reset_state_for_recompute()
        self.block_manager.free_cross(seq_group)
        self.waiting.appendleft(seq_group)
