"""Block-diagonal prefill masks as plain lists of block starts (xformers' fields, without importing xformers)."""
from __future__ import annotations

import dataclasses
import itertools
from typing import List, Optional, Sequence, Tuple, Union

import torch


@dataclasses.dataclass(frozen=True)
class SeqLenInfo:
    """How one dimension (queries or keys) splits into blocks: `seqstart_py[i]` is where block i starts, the last
    entry the dimension's length (xformers' `_SeqLenInfo.seqstart_py`)."""

    seqstart_py: List[int]

    @classmethod
    def from_seqlens(cls, seqlens: Sequence[int]) -> "SeqLenInfo":
        lengths = [int(length) for length in seqlens]
        if any(length < 0 for length in lengths):
            raise ValueError(f"block lengths must be >= 0, got {lengths}")
        return cls([0, *itertools.accumulate(lengths)])

    def intervals(self) -> List[Tuple[int, int]]:
        """(start, end) of each block."""
        return list(zip(self.seqstart_py[:-1], self.seqstart_py[1:]))


@dataclasses.dataclass(frozen=True)
class BlockDiagonalMask:
    """Query block i attends to all of key block i and to nothing else (xformers' `BlockDiagonalMask`)."""

    q_seqinfo: SeqLenInfo
    k_seqinfo: SeqLenInfo

    causal = False          # the query at offset r of its block sees keys up to offset r (+ the shift below)
    bottom_right = False    # causal blocks aligned at their last query and key: shift = k_len - q_len

    def __post_init__(self) -> None:
        if len(self.q_seqinfo.seqstart_py) != len(self.k_seqinfo.seqstart_py):
            raise ValueError(f"{len(self.q_seqinfo.seqstart_py) - 1} query blocks but "
                             f"{len(self.k_seqinfo.seqstart_py) - 1} key blocks")

    @classmethod
    def from_seqlens(cls, q_seqlen: Sequence[int], kv_seqlen: Optional[Sequence[int]] = None):
        """The mask of blocks with these query lengths and key lengths (default: the query lengths)."""
        q_seqinfo = SeqLenInfo.from_seqlens(q_seqlen)
        k_seqinfo = q_seqinfo if kv_seqlen is None else SeqLenInfo.from_seqlens(kv_seqlen)
        return cls(q_seqinfo=q_seqinfo, k_seqinfo=k_seqinfo)

    def materialize(self, shape: Optional[Tuple[int, int]] = None, dtype: torch.dtype = torch.float32,
                    device: Union[str, torch.device] = "cpu") -> torch.Tensor:
        """The additive mask [total queries, total keys] (or `shape`, top-left): 0 where a query attends, -inf
        elsewhere, as xformers' `materialize` gives it."""
        q_total, k_total = self.q_seqinfo.seqstart_py[-1], self.k_seqinfo.seqstart_py[-1]
        shape = shape or (q_total, k_total)
        mask = torch.full(shape, float("-inf"), dtype=dtype, device=device)
        for q_start, q_end, k_start, k_end in segment_bounds(self):
            block = torch.zeros(q_end - q_start, k_end - k_start, dtype=dtype, device=device)
            if self.causal:
                shift = (k_end - k_start) - (q_end - q_start) if self.bottom_right else 0
                block = block.masked_fill(block_causal_mask(q_end - q_start, k_end - k_start, shift, device)
                                          .logical_not(), float("-inf"))
            mask[q_start:q_end, k_start:k_end] = block
        return mask


@dataclasses.dataclass(frozen=True)
class BlockDiagonalCausalMask(BlockDiagonalMask):
    """Each block causal from its first query and key (xformers' `BlockDiagonalCausalMask`)."""

    causal = True


@dataclasses.dataclass(frozen=True)
class BlockDiagonalCausalFromBottomRightMask(BlockDiagonalMask):
    """Each block causal, aligned at its last query and key: the queries continue a cached context of
    k_len - q_len keys (xformers' `BlockDiagonalCausalFromBottomRightMask`)."""

    causal = True
    bottom_right = True

    def __post_init__(self) -> None:
        super().__post_init__()
        for index, (q_start, q_end, k_start, k_end) in enumerate(segment_bounds(self)):
            if k_end - k_start < q_end - q_start:
                raise ValueError(f"block {index} has {k_end - k_start} keys for {q_end - q_start} queries; a "
                                 f"bottom-right causal block needs at least as many keys as queries")


AttentionBias = BlockDiagonalMask


def is_causal(bias: AttentionBias) -> bool:
    """Whether the bias masks future keys (top-left or bottom-right aligned)."""
    return bias.causal


def segment_bounds(bias: AttentionBias) -> List[Tuple[int, int, int, int]]:
    """(q_start, q_end, k_start, k_end) for each block of a block-diagonal bias."""
    q_starts, k_starts = bias.q_seqinfo.seqstart_py, bias.k_seqinfo.seqstart_py
    return [(q_starts[i], q_starts[i + 1], k_starts[i], k_starts[i + 1]) for i in range(len(q_starts) - 1)]


def block_causal_mask(q_len: int, k_len: int, shift: int, device: Union[str, torch.device]) -> torch.Tensor:
    """Boolean [q_len, k_len]: True where query r may see key c, i.e. c <= r + shift."""
    rows = torch.arange(q_len, device=device)[:, None]
    cols = torch.arange(k_len, device=device)[None, :]
    return cols <= rows + shift
