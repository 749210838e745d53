"""What one scheduling step decided, and the limits it decided under: token/sequence budget, adapters, lengths."""
from __future__ import annotations

import dataclasses
from typing import Iterable, List, Optional, Set, Tuple

from seq2seq_engine.config import SchedulerConfig
from seq2seq_engine.sequence import SequenceGroup, SequenceGroupMetadata


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


class AdapterBudget:
    """The LoRA adapters the running requests hold: at most `max_loras` distinct ones (0: no limit, LoRA off), so
    that every step's adapters fit the device slots; a request whose adapter would pass the limit waits."""

    def __init__(self, max_loras: int, running: Iterable[SequenceGroup]) -> None:
        self.max_loras = max_loras
        self.adapters: Set[int] = {group.lora_int_id for group in running if group.lora_int_id}

    def admits(self, seq_group: SequenceGroup) -> bool:
        lora_id = seq_group.lora_int_id
        return (not lora_id or not self.max_loras or lora_id in self.adapters
                or len(self.adapters) < self.max_loras)

    def add(self, seq_group: SequenceGroup) -> None:
        if seq_group.lora_int_id:
            self.adapters.add(seq_group.lora_int_id)


def too_long_reason(config: SchedulerConfig, seq_group: SequenceGroup) -> Optional[str]:
    """Why a request can never run under `config`'s lengths, or None."""
    prompt_len = seq_group.first_seq.get_len()
    if prompt_len > config.max_model_len:
        return f"decoder prompt of {prompt_len} tokens exceeds max_model_len={config.max_model_len}"
    encoder_len = seq_group.encoder_len
    if encoder_len > config.max_encoder_len:
        return f"encoder prompt of {encoder_len} tokens exceeds max_encoder_len={config.max_encoder_len}"
    chunkable = config.enable_chunked_prefill and seq_group.encoder_len == 0
    if not chunkable and prompt_len + encoder_len > config.max_num_batched_tokens:
        return (f"prefill of {prompt_len} decoder + {encoder_len} encoder tokens exceeds "
                f"max_num_batched_tokens={config.max_num_batched_tokens}")
    return None


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


@dataclasses.dataclass
class StepState:
    """Mutable bookkeeping of one Scheduler.schedule() call."""

    budget: SchedulingBudget
    prefills: List[ScheduledSequenceGroup] = dataclasses.field(default_factory=list)
    decodes: List[ScheduledSequenceGroup] = dataclasses.field(default_factory=list)
    decode_metadata: List[SequenceGroupMetadata] = dataclasses.field(default_factory=list)  # one per decode
    blocks_to_swap_in: List[Tuple[int, int]] = dataclasses.field(default_factory=list)
    blocks_to_swap_out: List[Tuple[int, int]] = dataclasses.field(default_factory=list)
    blocks_to_copy: List[Tuple[int, int]] = dataclasses.field(default_factory=list)
    ignored: List[SequenceGroup] = dataclasses.field(default_factory=list)
    num_preempted: int = 0
    num_encoder_tokens: int = 0
