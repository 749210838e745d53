"""Split-K (flash-decoding) support for the paged decode attention: launch tuning, its checks and the combine stage."""
from __future__ import annotations

from typing import Dict, Optional, Tuple

import torch

from .triton_launch import kernel_for, max_combine, next_power_of_two, sum_combine, tl

# programs per SM the split heuristic aims for; splits never exceed this many (the combine stage's width)
_PROGRAMS_PER_SM = 4
_MAX_AUTO_SPLITS = 16
_MAX_SPLITS = 256
_SM_COUNTS: Dict[torch.device, int] = {}


def check_overrides(tile: Optional[int], num_warps: Optional[int], num_splits: Optional[int]) -> None:
    """ValueError naming the tuning override outside its range (None means the built-in choice)."""
    if tile is not None and (not isinstance(tile, int) or tile < 16 or tile > 256 or tile & (tile - 1)):
        raise ValueError(f"tile must be a power of two in 16..256, got {tile!r}")
    if num_warps is not None and (not isinstance(num_warps, int) or num_warps not in (1, 2, 4, 8, 16)):
        raise ValueError(f"num_warps must be one of 1, 2, 4, 8, 16, got {num_warps!r}")
    if num_splits is not None and (not isinstance(num_splits, int) or not 1 <= num_splits <= _MAX_SPLITS):
        raise ValueError(f"num_splits must be an integer in 1..{_MAX_SPLITS}, got {num_splits!r}")


def sm_count(device: torch.device) -> int:
    """The device's number of streaming multiprocessors, read once per device."""
    device = torch.device(device)
    if device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    if device not in _SM_COUNTS:
        _SM_COUNTS[device] = torch.cuda.get_device_properties(device).multi_processor_count
    return _SM_COUNTS[device]


def choose_splits(num_programs: int, capacity: int, tile: int, device: torch.device) -> int:
    """Splits of each context: 1 on the CPU, when (sequence, kv head) programs already fill the GPU, or for a short
    table; else enough for about four programs per SM, at most 16 and at most one per tile of the table."""
    tiles = -(-capacity // tile)
    if torch.device(device).type != "cuda" or tiles <= 4 or num_programs == 0:
        return 1
    target = _PROGRAMS_PER_SM * sm_count(device)
    if num_programs >= target:
        return 1
    return max(1, min(_MAX_AUTO_SPLITS, tiles, -(-target // num_programs)))


def split_length(capacity: int, num_splits: int, tile: int) -> int:
    """Tokens of each split: the table's capacity (a shape, so the launch never reads a length) shared out, rounded
    up to a whole number of tiles."""
    share = -(-capacity // num_splits)
    return max(tile, -(-share // tile) * tile)


def workspace_for(query: torch.Tensor, num_splits: int,
                  workspace: Optional[torch.Tensor]) -> torch.Tensor:
    """The float32 partials ``[num_seqs, num_heads, num_splits, head_size + 2]`` (acc, then max and sum)."""
    num_seqs, num_heads, head_size = query.shape
    shape = (num_seqs, num_heads, num_splits, head_size + 2)
    if workspace is None:
        return torch.empty(shape, dtype=torch.float32, device=query.device)
    if workspace.shape != shape or workspace.dtype != torch.float32 or workspace.device != query.device \
            or not workspace.is_contiguous():
        raise ValueError(f"workspace must be a contiguous float32 {shape} on {query.device}, got "
                         f"{workspace.dtype} {tuple(workspace.shape)} on {workspace.device}")
    return workspace


def combine_partials(workspace: torch.Tensor, out: torch.Tensor) -> None:
    """Second stage: one program per (sequence, query head) merges its splits' partials by log-sum-exp."""
    num_seqs, num_heads, num_splits, width = workspace.shape
    head_size = width - 2
    grid: Tuple[int, int] = (num_seqs, num_heads)
    kernel_for(_combine_kernel, out.device)[grid](
        out, workspace, num_splits, workspace.stride(0), workspace.stride(1), workspace.stride(2), out.stride(0),
        out.stride(1), HEAD_SIZE=head_size, HEAD_PAD=next_power_of_two(head_size),
        SPLITS_PAD=next_power_of_two(num_splits), num_warps=2)


def _combine_kernel(out_ptr, ws_ptr, num_splits, ws_stride_seq, ws_stride_head, ws_stride_split, out_stride_seq,
                    out_stride_head, HEAD_SIZE: tl.constexpr, HEAD_PAD: tl.constexpr, SPLITS_PAD: tl.constexpr):
    seq = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    splits = tl.arange(0, SPLITS_PAD)
    dims = tl.arange(0, HEAD_PAD)
    used = splits < num_splits
    rows = ws_ptr + seq * ws_stride_seq + head * ws_stride_head + splits * ws_stride_split
    best = tl.load(rows + HEAD_SIZE, mask=used, other=float("-inf"))
    total = tl.load(rows + HEAD_SIZE + 1, mask=used, other=0.0)
    acc = tl.load(rows[:, None] + dims[None, :], mask=used[:, None] & (dims < HEAD_SIZE)[None, :], other=0.0)
    overall = tl.reduce(best, 0, max_combine)
    # every split empty (a zero context): all maxima are -inf, and exp(-inf - 0) = 0 gives zeros, not NaN
    overall = tl.where(overall > float("-inf"), overall, 0.0)
    weights = tl.exp(best - overall)
    denominator = tl.reduce(total * weights, 0, sum_combine)
    result = tl.reduce(acc * weights[:, None], 0, sum_combine) / tl.where(denominator > 0.0, denominator, 1.0)
    out_row = out_ptr + seq * out_stride_seq + head * out_stride_head
    tl.store(out_row + dims, result.to(out_ptr.dtype.element_ty), mask=dims < HEAD_SIZE)
