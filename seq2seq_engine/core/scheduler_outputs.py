"""What one scheduling step decided, and the token/sequence budget it decided under."""
from __future__ import annotations

import dataclasses
from typing import List, Tuple

from seq2seq_engine.sequence import SequenceGroup


@dataclasses.dataclass
class SchedulingBudget:
    """Tokens (decoder tokens plus, at a request's first step, its encoder tokens) and sequences of one step."""

    token_budget: int
    max_num_seqs: int
    num_batched_tokens: int = 0
    num_curr_seqs: int = 0

    def can_schedule(self, num_new_tokens: int, num_new_seqs: int) -> bool:
        return (self.num_batched_tokens + num_new_tokens <= self.token_budget
                and self.num_curr_seqs + num_new_seqs <= self.max_num_seqs)

    def remaining_token_budget(self) -> int:
        return self.token_budget - self.num_batched_tokens

    def add(self, num_new_tokens: int, num_new_seqs: int) -> None:
        self.num_batched_tokens += num_new_tokens
        self.num_curr_seqs += num_new_seqs


@dataclasses.dataclass
class ScheduledSequenceGroup:
    """A request scheduled this step, with how many of its decoder tokens run (a chunk of a prompt, or 1)."""

    seq_group: SequenceGroup
    token_chunk_size: int
    is_prompt: bool


@dataclasses.dataclass
class SchedulerOutputs:
    """The step's batch (prefills first, then decodes) and the cache operations to run before it."""

    scheduled_seq_groups: List[ScheduledSequenceGroup]
    num_prefill_groups: int
    num_batched_tokens: int
    num_encoder_tokens: int
    blocks_to_swap_in: List[Tuple[int, int]]
    blocks_to_swap_out: List[Tuple[int, int]]
    blocks_to_copy: List[Tuple[int, int]]
    ignored_seq_groups: List[SequenceGroup]
    preempted: int
