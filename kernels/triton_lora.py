"""Triton grouped LoRA kernels (punica's shrink and expand) over the row tiles of each run of a mixed-adapter batch."""
from __future__ import annotations

from typing import Any

import torch

from .triton_launch import kernel_for, next_power_of_two, tl, triton_available

__all__ = ["triton_available", "triton_expand", "triton_shrink"]

# Rows of a program: each run of the batch is cut into tiles of BLOCK_ROWS rows (tl.dot's smallest M), the last
# tile of a run masked. The rank is padded to a power of two of at least 16 (tl.dot's smallest K and N), masked,
# and taken in blocks of at most _MAX_BLOCK_RANK.
BLOCK_ROWS = 16
_BLOCK_K = 32  # input features per shrink step
_MAX_BLOCK_RANK = 64  # ranks per shrink program (fused q/k/v ranks of 192 take three) and per expand step
_BLOCK_OUT = 64  # output columns per expand program


def triton_shrink(x: torch.Tensor, a: torch.Tensor, runs: Any, t: torch.Tensor) -> None:
    """t[i] = x[i] a[slot]^T for the rows of every run of ``runs`` (a LoRARuns; t's other rows untouched).

    x [rows, in] and t [rows, rank] with unit stride along a row; a [slots, rank, in] with unit stride along in.
    A grid of (row tile, rank block) programs; each reads its run's slot and accumulates in float32 (tl.dot, IEEE
    float32 products for float32 operands). CPU tensors run through Triton's interpreter."""
    tiles, segments = runs.tile_table(BLOCK_ROWS, x.device)
    num_tiles = tiles.shape[1]
    rank, in_features = a.shape[1], a.shape[2]
    block_rank = _block_rank(rank)
    grid = (num_tiles, -(-rank // block_rank))
    kernel_for(_shrink_kernel, x.device)[grid](
        x, a, t, tiles, segments, num_tiles, segments.shape[1], in_features, rank, x.stride(0), a.stride(0),
        a.stride(1), t.stride(0), BLOCK_M=BLOCK_ROWS, BLOCK_R=block_rank, BLOCK_K=_BLOCK_K,
        PRECISION=_precision(x.dtype), num_warps=4)


def triton_expand(t: torch.Tensor, b: torch.Tensor, runs: Any, y: torch.Tensor) -> None:
    """y[i] += t[i] b[slot]^T for the rows of every run (other rows untouched).

    t [rows, rank] and y [rows, out] with unit stride along a row (y may be a column slice of a wider output);
    b [slots, out, rank] with unit stride along the rank. A grid of (row tile, output block) programs; the sum is
    float32, added to y's value and rounded once to y's dtype."""
    tiles, segments = runs.tile_table(BLOCK_ROWS, t.device)
    num_tiles = tiles.shape[1]
    out_features, rank = b.shape[1], b.shape[2]
    grid = (num_tiles, -(-out_features // _BLOCK_OUT))
    kernel_for(_expand_kernel, t.device)[grid](
        t, b, y, tiles, segments, num_tiles, segments.shape[1], out_features, rank, t.stride(0), b.stride(0),
        b.stride(1), y.stride(0), BLOCK_M=BLOCK_ROWS, BLOCK_N=_BLOCK_OUT, BLOCK_R=_block_rank(rank),
        PRECISION=_precision(b.dtype), num_warps=4)


def _block_rank(rank: int) -> int:
    """Ranks a program takes at once: the rank padded to a power of two of at least 16, at most _MAX_BLOCK_RANK."""
    return min(_MAX_BLOCK_RANK, max(16, next_power_of_two(rank)))


def _precision(dtype: torch.dtype) -> str:
    """tl.dot's input precision: the operands are widened to float32 first (Triton's interpreter multiplies
    bfloat16 as raw bits), so bfloat16 and float16 values are exact in TF32 and run on its tensor cores; float32
    operands take IEEE products."""
    return "ieee" if dtype == torch.float32 else "tf32"


def _shrink_kernel(x_ptr, a_ptr, t_ptr, tile_ptr, seg_ptr, num_tiles, num_segments, in_features, rank, x_stride,
                   a_stride_slot, a_stride_rank, t_stride, BLOCK_M: tl.constexpr, BLOCK_R: tl.constexpr,
                   BLOCK_K: tl.constexpr, PRECISION: tl.constexpr):
    tile = tl.program_id(0)  # its first row and its run (end row, slot): the same lines in both kernels, as a
    first = tl.load(tile_ptr + tile)  # helper would have to be a jit function of the compiler or the interpreter
    segment = tl.load(tile_ptr + num_tiles + tile)
    slot = tl.load(seg_ptr + num_segments + segment).to(tl.int64)
    rows = (first + tl.arange(0, BLOCK_M)).to(tl.int64)
    row_mask = rows < tl.load(seg_ptr + segment)
    ranks = tl.program_id(1) * BLOCK_R + tl.arange(0, BLOCK_R)
    rank_mask = ranks < rank
    a_base = a_ptr + slot * a_stride_slot + ranks[None, :] * a_stride_rank
    acc = tl.full([BLOCK_M, BLOCK_R], 0.0, tl.float32)
    k0 = 0
    while k0 < in_features:  # not range(): Triton 3.6's interpreter cannot take an argument as its bound (NumPy 2)
        ks = k0 + tl.arange(0, BLOCK_K)
        k_mask = ks < in_features
        x = tl.load(x_ptr + rows[:, None] * x_stride + ks[None, :], mask=row_mask[:, None] & k_mask[None, :],
                    other=0.0)
        a = tl.load(a_base + ks[:, None], mask=k_mask[:, None] & rank_mask[None, :], other=0.0)  # [K, R]: A^T
        acc = tl.dot(x.to(tl.float32), a.to(tl.float32), acc, input_precision=PRECISION)
        k0 += BLOCK_K
    tl.store(t_ptr + rows[:, None] * t_stride + ranks[None, :], acc.to(t_ptr.dtype.element_ty),
             mask=row_mask[:, None] & rank_mask[None, :])


def _expand_kernel(t_ptr, b_ptr, y_ptr, tile_ptr, seg_ptr, num_tiles, num_segments, out_features, rank, t_stride,
                   b_stride_slot, b_stride_out, y_stride, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   BLOCK_R: tl.constexpr, PRECISION: tl.constexpr):
    tile = tl.program_id(0)  # its first row and its run (end row, slot): the same lines in both kernels, as a
    first = tl.load(tile_ptr + tile)  # helper would have to be a jit function of the compiler or the interpreter
    segment = tl.load(tile_ptr + num_tiles + tile)
    slot = tl.load(seg_ptr + num_segments + segment).to(tl.int64)
    rows = (first + tl.arange(0, BLOCK_M)).to(tl.int64)
    row_mask = rows < tl.load(seg_ptr + segment)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < out_features
    delta = tl.full([BLOCK_M, BLOCK_N], 0.0, tl.float32)
    r0 = 0
    while r0 < rank:
        ranks = r0 + tl.arange(0, BLOCK_R)
        rank_mask = ranks < rank
        t = tl.load(t_ptr + rows[:, None] * t_stride + ranks[None, :], mask=row_mask[:, None] & rank_mask[None, :],
                    other=0.0)
        b = tl.load(b_ptr + slot * b_stride_slot + cols[None, :] * b_stride_out + ranks[:, None],
                    mask=rank_mask[:, None] & col_mask[None, :], other=0.0)  # [R, N]: B^T
        delta = tl.dot(t.to(tl.float32), b.to(tl.float32), delta, input_precision=PRECISION)
        r0 += BLOCK_R
    y_tile = y_ptr + rows[:, None] * y_stride + cols[None, :]
    mask = row_mask[:, None] & col_mask[None, :]
    y = tl.load(y_tile, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_tile, (y + delta).to(y_ptr.dtype.element_ty), mask=mask)
