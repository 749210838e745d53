"""The linear wrapper that adds each row's adapter to a base linear's output (the rows' slots come from the step's
LoRA context), and the context itself: for each kind of row (encoder, decoder) the runs of slots of this step."""
from __future__ import annotations

import contextlib
from typing import Dict, Iterator, Optional

import torch
from torch import nn

from seq2seq_engine.kernels.lora_ops import LoRARuns, lora_apply
from seq2seq_engine.models.utils import get_activation


class RowSlots:
    """The adapter slots of one kind of row in a pass: `runs` (LoRARuns of the rows, in order), or `uniform`: one
    slot for every row, however many a layer sees (a pass that serves one adapter). `slots`: the slots present."""

    def __init__(self, runs: Optional[LoRARuns] = None, uniform: Optional[int] = None) -> None:
        self.runs, self.uniform = runs, uniform
        self.slots = frozenset([uniform] if uniform is not None else (slot for _, _, slot in runs.runs))
        self._uniform_runs: Dict[int, LoRARuns] = {}

    def runs_for(self, num_rows: int) -> LoRARuns:
        if self.uniform is None:
            return self.runs
        if num_rows not in self._uniform_runs:
            self._uniform_runs[num_rows] = LoRARuns.from_slots([self.uniform] * num_rows)
        return self._uniform_runs[num_rows]


_current_rows: Dict[str, RowSlots] = {}


@contextlib.contextmanager
def lora_rows(rows: Dict[str, RowSlots]) -> Iterator[None]:
    """Run the model with `rows` (row kind -> the slots of its rows) as the pass's adapter rows."""
    previous = dict(_current_rows)
    _current_rows.clear()
    _current_rows.update(rows)
    try:
        yield
    finally:
        _current_rows.clear()
        _current_rows.update(previous)


class LoRALinear(nn.Module):
    """`base` (nn.Linear, a packed or int8 linear) plus B·A·x of each row's adapter slot. Slots hold A [rank, in]
    and B [out, rank] (scaling folded in) in stacks allocated at the first adapter that adapts this linear; rows
    without an adapter, and steps whose adapters leave this linear alone, run the base alone."""

    def __init__(self, base: nn.Module, domain: str, in_features: int, out_features: int, num_slots: int,
                 slot_rank: int) -> None:
        super().__init__()
        self.base, self.domain = base, domain
        self.in_features, self.out_features = in_features, out_features
        self.num_slots, self.slot_rank = num_slots, slot_rank
        self.lora_a: Optional[torch.Tensor] = None     # [num_slots, slot_rank, in_features]
        self.lora_b: Optional[torch.Tensor] = None     # [num_slots, out_features, slot_rank]
        self.filled = [False] * num_slots

    @property
    def fuses_activations(self) -> bool:
        return getattr(self.base, "fuses_activations", False)

    @property
    def slot_bytes(self) -> int:
        """Bytes the slot stacks hold (0 before an adapter adapted this linear)."""
        if self.lora_a is None:
            return 0
        return (self.lora_a.numel() + self.lora_b.numel()) * self.lora_a.element_size()

    def set_slot(self, slot: int, weights: Optional[tuple], dtype: torch.dtype, device: torch.device) -> None:
        """Fill `slot` with (A, B) of one adapter, or mark it empty (None: the adapter leaves this linear alone)."""
        if weights is None:
            if self.lora_a is not None:     # rows of this slot may share a step with other slots' rows
                self.lora_a[slot].zero_()
                self.lora_b[slot].zero_()
            self.filled[slot] = False
            return
        a, b = weights
        if self.lora_a is None:
            self.lora_a = torch.zeros(self.num_slots, self.slot_rank, self.in_features, dtype=dtype, device=device)
            self.lora_b = torch.zeros(self.num_slots, self.out_features, self.slot_rank, dtype=dtype, device=device)
        self.lora_a[slot].zero_()
        self.lora_b[slot].zero_()
        self.lora_a[slot, :a.shape[0]].copy_(a)
        self.lora_b[slot, :b.shape[0], :b.shape[1]].copy_(b)
        self.filled[slot] = True

    def _runs(self, num_rows: int) -> Optional[LoRARuns]:
        rows = _current_rows.get(self.domain)
        if rows is None or self.lora_a is None or not any(self.filled[slot] for slot in rows.slots):
            return None
        return rows.runs_for(num_rows)

    def forward(self, x: torch.Tensor, addend: Optional[torch.Tensor] = None,
                activation: Optional[str] = None) -> torch.Tensor:
        x_rows = x.reshape(-1, self.in_features)
        runs = self._runs(x_rows.shape[0])
        if runs is None:
            return self._base(x, addend, activation)
        out = self._base(x, addend, None)
        lora_apply(x_rows, self.lora_a, self.lora_b, runs, out.view(-1, self.out_features))
        return out if activation is None else get_activation(activation)(out)

    def _base(self, x: torch.Tensor, addend: Optional[torch.Tensor], activation: Optional[str]) -> torch.Tensor:
        if addend is None and activation is None:
            return self.base(x)
        return self.base(x, addend=addend, activation=activation)

    def extra_repr(self) -> str:
        return f"{self.domain} rows, {self.num_slots} slots of rank {self.slot_rank}"
