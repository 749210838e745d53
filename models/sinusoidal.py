"""Fixed sinusoidal position embeddings: the Marian/Pegasus layout and the M2M100/NLLB (fairseq) layout.

Both are tables computed at construction and sized from ``max_position_embeddings``: the engine's input
preprocessor refuses encoder and decoder sequences longer than that, so every position a forward pass sees is
in the table. Rows are looked up per token from the engine's ``positions`` (0-based within each sequence).

* Marian/Pegasus: row ``p`` = ``[sin(p / 10000^(2i/d)) for the ceil(d/2) even columns,
  cos(p / 10000^(2i/d)) for the floor(d/2) odd columns]`` (computed in float64, stored in float32); no offset.
* M2M100/NLLB: row ``r`` = ``[sin(r * w_i), cos(r * w_i)]`` with ``w_i = exp(-i * ln(10000) / (d/2 - 1))``
  (float32, a zero column appended for odd ``d``), looked up at ``r = p + padding_idx + 1``; a token equal to
  ``padding_idx`` gets the all-zero row ``padding_idx``.
"""
from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn


def marian_sinusoidal_table(num_positions: int, dim: int) -> torch.Tensor:
    """[num_positions, dim] float32: sines of the even-column frequencies, then cosines of the odd ones."""
    positions = torch.arange(num_positions, dtype=torch.float64).unsqueeze(1)
    exponents = (2 * (torch.arange(dim) // 2)).to(torch.float64) / dim
    angles = positions / torch.pow(torch.tensor(10000.0, dtype=torch.float64), exponents)
    return torch.cat([torch.sin(angles[:, 0::2]), torch.cos(angles[:, 1::2])], dim=1).to(torch.float32)


def fairseq_sinusoidal_table(num_rows: int, dim: int, padding_idx: Optional[int]) -> torch.Tensor:
    """[num_rows, dim] float32: [sin | cos] of row * frequency, zero column for odd dim, zero padding row."""
    half = dim // 2
    if half < 2:
        raise ValueError(f"d_model must be at least 4 for sinusoidal positions, got {dim}")
    step = math.log(10000) / (half - 1)
    frequencies = torch.exp(torch.arange(half, dtype=torch.int64).float() * -step)
    angles = torch.arange(num_rows, dtype=torch.int64).float().unsqueeze(1) * frequencies.unsqueeze(0)
    table = torch.cat([torch.sin(angles), torch.cos(angles)], dim=1)
    if dim % 2:
        table = torch.cat([table, torch.zeros(num_rows, 1)], dim=1)
    if padding_idx is not None:
        table[padding_idx] = 0.0
    return table


class SinusoidalPositions(nn.Module):
    """Looks up ``table[positions + offset]``; with ``padding_idx`` a token equal to it gets row ``padding_idx``.

    The table is a non-persistent buffer (not a checkpoint tensor): it follows the model's device and dtype.
    """

    def __init__(self, table: torch.Tensor, offset: int = 0, padding_idx: Optional[int] = None) -> None:
        super().__init__()
        self.offset = offset
        self.padding_idx = padding_idx
        self.register_buffer("table", table, persistent=False)

    @classmethod
    def marian(cls, max_positions: int, dim: int) -> "SinusoidalPositions":
        return cls(marian_sinusoidal_table(max_positions, dim))

    @classmethod
    def fairseq(cls, max_positions: int, dim: int, padding_idx: int) -> "SinusoidalPositions":
        offset = padding_idx + 1
        return cls(fairseq_sinusoidal_table(max_positions + offset, dim, padding_idx), offset, padding_idx)

    @property
    def max_positions(self) -> int:
        return self.table.shape[0] - self.offset

    def forward(self, positions: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
        rows = positions + self.offset
        if self.padding_idx is not None:
            rows = torch.where(input_ids == self.padding_idx, torch.full_like(rows, self.padding_idx), rows)
        return F.embedding(rows, self.table)

    def check_checkpoint_table(self, name: str, tensor: torch.Tensor) -> None:
        """ValueError unless a checkpoint's stored position table equals this one on their common rows (the
        engine recomputes the table; a checkpoint with other values would be silently wrong)."""
        if tensor.dim() != 2 or tensor.shape[1] != self.table.shape[1]:
            raise ValueError(f"checkpoint tensor {name!r} has shape {tuple(tensor.shape)}; expected a sinusoidal "
                             f"table of width {self.table.shape[1]}")
        rows = min(tensor.shape[0], self.table.shape[0])
        stored = tensor[:rows].to(torch.float32)
        tolerance = torch.finfo(tensor.dtype).eps if tensor.is_floating_point() else 0.0
        expected = self.table[:rows].to(device=stored.device, dtype=torch.float32)
        if not torch.allclose(stored, expected, rtol=0.0, atol=max(tolerance, 1e-6)):
            raise ValueError(f"checkpoint tensor {name!r} is not the sinusoidal position table this model "
                             f"computes (max difference {(stored - expected).abs().max().item():.3g})")
