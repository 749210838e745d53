"""Triton paged decode attention (self and cross) with T5's relative position bias computed in the kernel."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Tuple

import torch

from .cache_dtype import FP8
from .relative_buckets import relative_position_bucket
from .triton_launch import (check_device, kernel_for, max_combine, next_power_of_two, sum_combine, tl, token_tile,
                            triton_available)
from .triton_split import check_overrides, choose_splits, combine_partials, split_length, workspace_for

__all__ = ["RelativeBias", "paged_decode_attention", "triton_available"]

SUPPORTED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# A cache may also hold float8 e4m3 (kernels/cache_dtype.py), widened to float32 as it is read.
CACHE_DTYPES = SUPPORTED_DTYPES + (FP8,)
# Elements of the [query heads, tokens, head dims] product tile one program of four warps holds at once (more
# spills registers on sm_90: ptxas -v on the compiled kernel); larger GQA groups take eight warps.
_TILE_ELEMENTS = 4096
# Warps per program by the elements of a K tile. On an H100 (benchmarks/gpu_decode_kernel.py, 2026-11-27) Whisper
# large-v3's cross attention (128 sequences x 20 heads x 1,500 tokens, 32 x 64 tiles) took 456 us with 2 warps,
# 551 with 4 and 607 with 8.
_WARPS_BY_ELEMENTS = ((2048, 2), (4096, 4))
_MAX_TILE = 32


@dataclass(frozen=True, eq=False)
class RelativeBias:
    """T5's relative position bias: ``table[bucket(t - query_positions[i]), h]`` is added to head ``h``'s scaled
    score of sequence ``i`` against key position ``t``; ``table`` is the ``nn.Embedding`` weight
    ``[num_buckets, num_heads]``, ``query_positions`` int ``[num_seqs]`` (a decode query's own position,
    its context length minus one for self-attention)."""

    table: torch.Tensor
    query_positions: torch.Tensor
    num_buckets: int
    max_distance: int
    bidirectional: bool


def paged_decode_attention(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                           block_tables: torch.Tensor, context_lens: torch.Tensor, scale: float,
                           relative_bias: Optional[RelativeBias] = None,
                           out: Optional[torch.Tensor] = None, *, tile: Optional[int] = None,
                           num_warps: Optional[int] = None, num_splits: Optional[int] = None,
                           workspace: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Single-query attention of each sequence over its paged context, the contract of ``paged_attention``.

    query ``[num_seqs, num_heads, head_size]``; caches ``[num_blocks, block_size, num_kv_heads, head_size]`` (of the
    query's dtype or another, float8 e4m3 included);
    block_tables int32 ``[num_seqs, max_blocks]``; context_lens int32 ``[num_seqs]``. Query head ``h`` reads kv
    head ``h // (num_heads // num_kv_heads)``; a zero context gives zeros; softmax in float32; cache slots past
    a context are never read. One program per (sequence, kv head) walks the blocks up to the length it reads
    itself, so the launch depends on shapes only (CUDA-graph capturable, no host sync). CPU tensors run the same
    kernel source through Triton's interpreter. Returns ``out`` (``[num_seqs, num_heads, head_size]`` in
    ``query.dtype``), allocated when not given.

    With ``num_splits`` > 1 (split-K, flash-decoding) each context is cut into that many contiguous shares of the
    table's capacity, one program each, writing float32 partials to ``workspace`` (``[num_seqs, num_heads,
    num_splits, head_size + 2]``, allocated when not given) that a second kernel merges into ``out``. ``tile``
    (tokens per step), ``num_warps`` and ``num_splits`` override the built-in choices (None: the heuristic).
    """
    check_overrides(tile, num_warps, num_splits)
    _check_inputs(query, key_cache, value_cache, block_tables, context_lens)
    num_seqs, num_heads, head_size = query.shape
    _, block_size, num_kv_heads, _ = key_cache.shape
    out = _check_out(out, query)
    if num_seqs == 0:
        return out
    if query.stride(-1) != 1:
        query = query.contiguous()
    block_tables = block_tables.contiguous()
    group = num_heads // num_kv_heads
    group_pad, head_pad = next_power_of_two(group), next_power_of_two(head_size)
    if tile is None:
        tile = token_tile(_TILE_ELEMENTS // (group_pad * head_pad), largest=_MAX_TILE)
    if num_warps is None:
        num_warps = _default_warps(group_pad * head_pad * tile)
    capacity = block_tables.shape[1] * block_size
    if num_splits is None:
        num_splits = choose_splits(num_seqs * num_kv_heads, capacity, tile, query.device)
    if relative_bias is None:
        bias_args: Tuple = (query, context_lens, context_lens, 0, 0, 0)
    else:
        bias_args = _bias_args(relative_bias, num_seqs, num_heads, query.device)
    split = num_splits > 1
    partials = workspace_for(query, num_splits, workspace) if split else out
    ws_strides = partials.stride()[:3] if split else (0, 0, 0)
    kernel_for(_paged_decode_kernel, query.device)[(num_seqs, num_kv_heads, num_splits)](
        out, partials, query, key_cache, value_cache, block_tables, context_lens, *bias_args, float(scale),
        block_tables.shape[1], split_length(capacity, num_splits, tile), query.stride(0), query.stride(1),
        key_cache.stride(0), key_cache.stride(1), key_cache.stride(2), value_cache.stride(0), value_cache.stride(1),
        value_cache.stride(2), out.stride(0), out.stride(1), *ws_strides, block_tables.stride(0),
        GROUP=group, GROUP_PAD=group_pad, HEAD_SIZE=head_size, HEAD_PAD=head_pad, BLOCK_SIZE=block_size,
        TILE=tile, HAS_BIAS=relative_bias is not None, SPLIT=split, num_warps=num_warps)
    if split:
        combine_partials(partials, out)
    return out


def _default_warps(tile_elements: int) -> int:
    return next((warps for limit, warps in _WARPS_BY_ELEMENTS if tile_elements <= limit), 8)


def _paged_decode_kernel(out_ptr, ws_ptr, q_ptr, k_ptr, v_ptr, tables_ptr, lens_ptr, bias_ptr, positions_ptr,
                         lut_ptr, bias_stride_bucket, bias_stride_head, max_distance, scale, max_blocks, split_len,
                         q_stride_seq, q_stride_head, k_stride_block, k_stride_slot, k_stride_head,
                         v_stride_block, v_stride_slot, v_stride_head, out_stride_seq, out_stride_head,
                         ws_stride_seq, ws_stride_head, ws_stride_split, table_stride, GROUP: tl.constexpr,
                         GROUP_PAD: tl.constexpr, HEAD_SIZE: tl.constexpr, HEAD_PAD: tl.constexpr,
                         BLOCK_SIZE: tl.constexpr, TILE: tl.constexpr, HAS_BIAS: tl.constexpr, SPLIT: tl.constexpr):
    seq = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    members = tl.arange(0, GROUP_PAD)
    heads = kv_head * GROUP + members
    dims = tl.arange(0, HEAD_PAD)
    head_mask = (members < GROUP)[:, None] & (dims < HEAD_SIZE)[None, :]
    q = tl.load(q_ptr + seq * q_stride_seq + heads[:, None] * q_stride_head + dims[None, :], mask=head_mask,
                other=0.0).to(tl.float32) * scale
    # the table's capacity bounds the walk, so a context length past it never reads outside the table row
    length = tl.minimum(tl.load(lens_ptr + seq), max_blocks * BLOCK_SIZE)
    query_position = 0
    if HAS_BIAS:
        query_position = tl.load(positions_ptr + seq)
    best = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    total = tl.full([GROUP_PAD], 0.0, tl.float32)
    acc = tl.full([GROUP_PAD, HEAD_PAD], 0.0, tl.float32)
    # this program's share of the context (all of it without splits); a share past the length reads nothing
    start = split * split_len
    end = tl.minimum(length, start + split_len)
    # a while loop: Triton 3.6's interpreter cannot take a loaded length as a range() bound under NumPy 2
    while start < end:
        tokens = start + tl.arange(0, TILE)
        valid = tokens < end
        blocks = tl.load(tables_ptr + seq * table_stride + tokens // BLOCK_SIZE, mask=valid, other=0).to(tl.int64)
        slots = tokens % BLOCK_SIZE
        kv_mask = valid[:, None] & (dims < HEAD_SIZE)[None, :]
        k_rows = blocks * k_stride_block + slots * k_stride_slot + kv_head * k_stride_head
        k = tl.load(k_ptr + k_rows[:, None] + dims[None, :], mask=kv_mask, other=0.0).to(tl.float32)
        scores = tl.reduce(q[:, None, :] * k[None, :, :], 2, sum_combine)
        if HAS_BIAS:
            relative = tl.minimum(tl.maximum(tokens - query_position, -max_distance), max_distance)
            buckets = tl.load(lut_ptr + relative + max_distance, mask=valid, other=0)
            bias_mask = (members < GROUP)[:, None] & valid[None, :]
            bias = tl.load(bias_ptr + buckets[None, :] * bias_stride_bucket + heads[:, None] * bias_stride_head,
                           mask=bias_mask, other=0.0)
            scores += bias.to(tl.float32)
        scores = tl.where(valid[None, :], scores, float("-inf"))
        new_best = tl.maximum(best, tl.reduce(scores, 1, max_combine))
        rescale = tl.exp(best - new_best)
        probs = tl.exp(scores - new_best[:, None])
        total = total * rescale + tl.reduce(probs, 1, sum_combine)
        v_rows = blocks * v_stride_block + slots * v_stride_slot + kv_head * v_stride_head
        v = tl.load(v_ptr + v_rows[:, None] + dims[None, :], mask=kv_mask, other=0.0).to(tl.float32)
        acc = acc * rescale[:, None] + tl.reduce(probs[:, :, None] * v[None, :, :], 1, sum_combine)
        best = new_best
        start += TILE
    if SPLIT:  # unnormalised partials, then the running max and sum, for the combine stage
        rows = ws_ptr + seq * ws_stride_seq + heads * ws_stride_head + split * ws_stride_split
        tl.store(rows[:, None] + dims[None, :], acc, mask=head_mask)
        tl.store(rows + HEAD_SIZE, best, mask=members < GROUP)
        tl.store(rows + HEAD_SIZE + 1, total, mask=members < GROUP)
    else:
        result = acc / tl.where(total > 0.0, total, 1.0)[:, None]
        out_rows = seq * out_stride_seq + heads * out_stride_head
        tl.store(out_ptr + out_rows[:, None] + dims[None, :], result.to(out_ptr.dtype.element_ty), mask=head_mask)


def _bias_args(bias: RelativeBias, num_seqs: int, num_heads: int, device: torch.device) -> Tuple:
    """The kernel's bias arguments, after checking the bias fits the query."""
    if not isinstance(bias, RelativeBias):
        raise TypeError(f"relative_bias must be a RelativeBias, got {type(bias).__name__}")
    table, positions = bias.table, bias.query_positions
    if table.dim() != 2 or table.shape != (bias.num_buckets, num_heads):
        raise ValueError(f"relative_bias.table must be [num_buckets={bias.num_buckets}, num_heads={num_heads}], "
                         f"got {tuple(table.shape)}")
    if table.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"relative_bias.table dtype must be one of {SUPPORTED_DTYPES}, got {table.dtype}")
    if positions.shape != (num_seqs,) or positions.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"relative_bias.query_positions must be int32/int64 [num_seqs={num_seqs}], got "
                         f"{positions.dtype} {tuple(positions.shape)}")
    check_device("relative_bias.table", table, device)
    check_device("relative_bias.query_positions", positions, device)
    lut = bucket_lut(bias.num_buckets, bias.max_distance, bias.bidirectional, device)
    return table, positions, lut, table.stride(0), table.stride(1), bias.max_distance


_LUTS: Dict[tuple, torch.Tensor] = {}


def bucket_lut(num_buckets: int, max_distance: int, bidirectional: bool, device: torch.device) -> torch.Tensor:
    """int32 bucket of every relative position clamped to ``[-max_distance, max_distance]`` (entry ``r +
    max_distance``), by T5's bucket function in torch, so the kernel's buckets are exactly the torch path's
    (no approximate log on the device). Beyond ``max_distance`` the bucket no longer changes, so the clamp is exact.
    Cached per configuration and device; built with device ops only (no host copy), so it may be built inside a
    CUDA-graph capture."""
    exact = (num_buckets // 2 if bidirectional else num_buckets) // 2
    if exact < 1 or max_distance <= exact:
        raise ValueError(f"relative_bias.max_distance ({max_distance}) must exceed the exact-bucket count "
                         f"({exact}) of num_buckets={num_buckets}")
    key = (num_buckets, max_distance, bidirectional, torch.device(device))
    if key not in _LUTS:
        relative = torch.arange(-max_distance, max_distance + 1, device=device)
        _LUTS[key] = relative_position_bucket(relative, bidirectional, num_buckets, max_distance).to(torch.int32)
    return _LUTS[key]


def _check_inputs(query, key_cache, value_cache, block_tables, context_lens) -> None:
    """Shapes, dtypes, devices and layouts (no device sync)."""
    if query.dim() != 3 or key_cache.dim() != 4 or key_cache.shape != value_cache.shape:
        raise ValueError(f"query must be [num_seqs, num_heads, head_size] and the caches [num_blocks, block_size, "
                         f"num_kv_heads, head_size] alike, got {tuple(query.shape)}, {tuple(key_cache.shape)}, "
                         f"{tuple(value_cache.shape)}")
    num_seqs, num_heads, head_size = query.shape
    block_size, num_kv_heads = key_cache.shape[1], key_cache.shape[2]
    if key_cache.shape[3] != head_size or num_heads % num_kv_heads != 0:
        raise ValueError(f"query heads {num_heads}x{head_size} do not fit the cache's {num_kv_heads}x"
                         f"{key_cache.shape[3]}")
    if block_size & (block_size - 1):
        raise ValueError(f"key_cache block_size must be a power of two, got {block_size}")
    if block_tables.dim() != 2 or block_tables.shape[0] != num_seqs or context_lens.shape != (num_seqs,):
        raise ValueError(f"block_tables {tuple(block_tables.shape)} and context_lens {tuple(context_lens.shape)} "
                         f"must cover num_seqs={num_seqs}")
    if query.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"query dtype must be one of {SUPPORTED_DTYPES}, got {query.dtype}")
    for name, tensor in (("key_cache", key_cache), ("value_cache", value_cache)):
        if tensor.dtype not in CACHE_DTYPES:
            raise TypeError(f"{name} dtype must be one of {CACHE_DTYPES}, got {tensor.dtype}")
    for name, tensor in (("block_tables", block_tables), ("context_lens", context_lens)):
        if tensor.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"{name} must be int32 or int64, got {tensor.dtype}")
    tensors = (("key_cache", key_cache), ("value_cache", value_cache), ("block_tables", block_tables),
               ("context_lens", context_lens))
    for name, tensor in tensors:
        check_device(name, tensor, query.device)
    if key_cache.stride(3) != 1 or value_cache.stride(3) != 1:
        raise ValueError("key_cache and value_cache must have a contiguous head_size dimension (stride 1)")
    if context_lens.device.type == "cpu" and num_seqs:
        longest, capacity = int(context_lens.max()), block_tables.shape[1] * block_size
        if longest > capacity:
            raise ValueError(f"context_lens: {longest} tokens exceed the block table capacity of {capacity}")


def _check_out(out: Optional[torch.Tensor], query: torch.Tensor) -> torch.Tensor:
    """``out`` when it fits the query (shape, dtype, device, contiguous head_size), else a new tensor."""
    if out is None:
        return torch.empty_like(query, memory_format=torch.contiguous_format)
    if out.shape != query.shape or out.dtype != query.dtype or out.device != query.device or out.stride(-1) != 1:
        raise ValueError(f"out must be {query.dtype} {tuple(query.shape)} on {query.device} with a contiguous last "
                         f"dimension, got {out.dtype} {tuple(out.shape)} on {out.device}")
    return out
