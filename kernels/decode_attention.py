"""Paged decode attention over a block-table KV cache, vectorised over the batch (device-agnostic torch)."""
from __future__ import annotations

import functools
import logging
from typing import Callable, Optional, Tuple

import torch
import torch.nn.functional as F

from seq2seq_engine.platforms import current_platform

from .cache_dtype import FP8, compute_dtype_of, storage_view
from .native_attention import native_paged_attention

logger = logging.getLogger(__name__)

# The dtypes the Triton decode kernel is given (a cache may also be float8); anything else (float64) takes the torch
# path.
TRITON_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
TRITON_CACHE_DTYPES = TRITON_DTYPES + (FP8,)

# Gathered-K bytes per chunk of sequences. On CPU a chunk stays cache-resident (the gather buffer is
# reused across chunks); on accelerators one chunk normally covers the whole batch.
CPU_CHUNK_BYTES = 16 * 1024 * 1024
DEVICE_CHUNK_BYTES = 1024 * 1024 * 1024


def paged_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    max_context_len: Optional[int] = None,
    position_bias: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Single-query (decode) attention of each sequence over its cached context.

    query ``[num_seqs, num_heads, head_size]``; caches ``[num_blocks, block_size, num_kv_heads, head_size]``;
    block_tables int ``[num_seqs, max_blocks_per_seq]``; context_lens int ``[num_seqs]``. Sequence ``i``
    attends (non-causally) to its first ``context_lens[i]`` cached tokens. GQA/MQA: query head ``h`` uses kv
    head ``h // (num_heads // num_kv_heads)``. Serves decoder self-attention and cross-attention alike.
    Returns ``[num_seqs, num_heads, head_size]`` in ``query.dtype``; rows with a context length of 0 are zero.
    Softmax is computed in float32 (or wider). Cache slots past a sequence's context are never read into the
    output, so uninitialised (even NaN) cache memory there is harmless. ``max_context_len`` (an upper bound on
    ``context_lens``) is only used for tensors on accelerators, to size the work without a device sync; on CPU
    the exact lengths are read directly. On the CPU the fused native kernel (kernels/csrc/) runs when it is built
    and the caches are contiguous float32/bfloat16; on CUDA, without a position bias, the Triton kernel where the
    CUDA platform chose it; otherwise the torch path below.
    ``position_bias`` ``[num_seqs, num_heads, >= longest context]`` (optional, e.g. T5's relative position bias)
    is added to the scaled scores: entry ``[i, h, t]`` to head ``h`` of sequence ``i`` against cached position ``t``.
    """
    _check_args(query, key_cache, value_cache, block_tables, context_lens)
    position_bias = _check_position_bias(position_bias, query.shape[:2], context_lens, max_context_len)
    num_seqs, num_heads, head_size = query.shape
    _, block_size, num_kv_heads, _ = key_cache.shape
    group = num_heads // num_kv_heads
    triton_dtypes = query.dtype in TRITON_DTYPES and key_cache.dtype in TRITON_CACHE_DTYPES
    if position_bias is None and query.is_cuda and triton_dtypes:
        triton = triton_decode_kernels()
        if triton is not None:
            return triton[0](query, key_cache, value_cache, block_tables, context_lens, scale)
    native = native_paged_attention(query, key_cache, value_cache, block_tables, context_lens, scale, position_bias)
    if native is not None:
        return native
    compute_dtype = _compute_dtype(query.dtype, key_cache.dtype)
    device = key_cache.device
    host_lens = _host_lens(context_lens, max_context_len)
    max_len = int(host_lens.max()) if num_seqs else 0
    if max_len <= 0:
        return torch.zeros_like(query)
    if max_len > block_tables.shape[1] * block_size:
        capacity = block_tables.shape[1] * block_size
        raise ValueError(f"context length {max_len} exceeds the block table capacity of {capacity} tokens")
    out = torch.zeros(num_seqs, num_kv_heads, group, head_size, dtype=compute_dtype, device=device)
    lens = context_lens.to(device=device, dtype=torch.int64)
    q = (query.to(device=device, dtype=compute_dtype) * scale).view(num_seqs, num_kv_heads, group, head_size)
    tables = block_tables.to(device=device, dtype=torch.int64)
    rows = _token_rows(tables, lens, max_len, block_size, num_kv_heads)
    score_mask = _score_mask(lens, max_len, position_bias, (num_seqs, num_kv_heads, group), compute_dtype)
    chunk = _chunk_seqs(device, num_kv_heads * max_len * head_size * compute_dtype.itemsize)
    workspace = _Workspace(key_cache, min(chunk, num_seqs) * num_kv_heads * max_len * head_size, compute_dtype)
    for start in range(0, num_seqs, chunk):
        stop = min(start + chunk, num_seqs)
        chunk_len = int(host_lens[start:stop].max())
        if chunk_len > 0:
            chunk_rows, chunk_mask = rows[start:stop, :, :chunk_len], score_mask[start:stop, :, :, :chunk_len]
            out[start:stop] = _attend_chunk(q[start:stop], key_cache, value_cache, chunk_rows, chunk_mask, workspace)
    out.masked_fill_((lens == 0).view(num_seqs, 1, 1, 1), 0.0)
    return out.view(num_seqs, num_heads, head_size).to(query.dtype)


def triton_decode_kernels() -> Optional[Tuple[Callable, type]]:
    """(paged_decode_attention, RelativeBias) where the CUDA platform chose the Triton kernels and they load, else
    None: the torch path runs."""
    if current_platform("cuda").paged_kernels != "triton":
        return None
    return load_triton_decode()


@functools.lru_cache(maxsize=None)
def load_triton_decode() -> Optional[Tuple[Callable, type]]:
    """(paged_decode_attention, RelativeBias) of kernels/triton_attention.py, or None (logged once) where the module
    does not load or Triton has no GPU to run on."""
    try:
        from .triton_attention import RelativeBias, paged_decode_attention, triton_available
    except ImportError as error:
        logger.warning("the Triton paged decode kernel does not load (%s): decode attention runs the torch path",
                       error)
        return None
    if not triton_available():
        logger.warning("Triton reports no usable GPU: decode attention runs the torch path")
        return None
    return paged_decode_attention, RelativeBias


class _Workspace:
    """Per-call gather buffers reused across chunks (avoids re-faulting fresh pages for every chunk).

    Each ``gather`` overwrites the previous result, so a gathered tensor is only valid until the next call.
    """

    def __init__(self, cache: torch.Tensor, numel: int, compute_dtype: torch.dtype):
        self.raw = torch.empty(numel, dtype=cache.dtype, device=cache.device)
        self.wide = None
        if cache.dtype != compute_dtype:
            self.wide = torch.empty(numel, dtype=compute_dtype, device=cache.device)

    def gather(self, cache: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """Rows ``[n, kv_heads, T]`` of the flattened cache -> ``[n, kv_heads, T, head_size]`` in compute dtype."""
        head_size = cache.shape[-1]
        flat_rows = rows.reshape(-1)
        raw = self.raw[: flat_rows.numel() * head_size].view(-1, head_size)
        torch.index_select(storage_view(cache).reshape(-1, head_size), 0, flat_rows, out=storage_view(raw))
        if self.wide is not None:
            raw = self.wide[: raw.numel()].view_as(raw).copy_(raw)
        return raw.view(*rows.shape, head_size)


def _attend_chunk(q, key_cache, value_cache, rows, mask, workspace: _Workspace) -> torch.Tensor:
    """One chunk: q ``[n, kvh, g, d]``, rows ``[n, kvh, T]``, additive score mask ``[n, kvh or 1, g or 1, T]``
    (``_score_mask``) -> ``[n, kvh, g, d]``."""
    rows = rows.contiguous()
    keys = workspace.gather(key_cache, rows)
    scores = torch.matmul(q, keys.transpose(-1, -2))  # [n, kvh, g, T]
    scores += mask
    probs = torch.softmax(scores, dim=-1)
    if value_cache.dtype == q.dtype:
        return _weighted_rows(probs, rows, value_cache)
    return torch.matmul(probs, workspace.gather(value_cache, rows))  # reuses the key buffer (keys are done)


def _weighted_rows(probs: torch.Tensor, rows: torch.Tensor, value_cache: torch.Tensor) -> torch.Tensor:
    """Fused gather + weighted sum of value rows (no materialised V): one embedding bag per query head."""
    n, kvh, group, num_tokens = probs.shape
    head_size = value_cache.shape[-1]
    indices = rows.unsqueeze(2).expand(n, kvh, group, num_tokens).reshape(-1)
    offsets = torch.arange(0, indices.numel(), num_tokens, device=rows.device)
    summed = F.embedding_bag(
        indices, value_cache.reshape(-1, head_size), offsets, mode="sum", per_sample_weights=probs.reshape(-1)
    )
    return summed.view(n, kvh, group, head_size)


def _score_mask(lens: torch.Tensor, max_len: int, position_bias: Optional[torch.Tensor], shape,
                dtype: torch.dtype) -> torch.Tensor:
    """Additive score mask ``[n, kvh or 1, g or 1, max_len]``: -inf past each context, plus the position bias (as
    ``[n, kvh, g, max_len]``) when there is one."""
    num_seqs, num_kv_heads, group = shape
    padding = torch.arange(max_len, device=lens.device) >= lens[:, None]
    if position_bias is None:
        mask = torch.zeros(num_seqs, 1, 1, max_len, dtype=dtype, device=lens.device)
    else:
        mask = position_bias[:, :, :max_len].to(device=lens.device, dtype=dtype)
        mask = mask.reshape(num_seqs, num_kv_heads, group, max_len)
    return mask.masked_fill(padding[:, None, None, :], float("-inf"))


def _token_rows(tables, lens, num_tokens: int, block_size: int, num_kv_heads: int) -> torch.Tensor:
    """Flattened-cache row index ``[n, kv_heads, num_tokens]`` of every (sequence, kv head, position).

    Positions at or past a sequence's length are redirected to its position 0 (a written, finite row), so the
    zero softmax weight they get never multiplies uninitialised memory; block-table padding is never followed
    (it may even be -1).
    """
    positions = torch.arange(num_tokens, device=tables.device)
    blocks = tables.index_select(1, torch.div(positions, block_size, rounding_mode="floor"))
    slots = blocks * block_size + positions % block_size
    slots = torch.where(positions < lens[:, None], slots, slots[:, :1]).clamp_(min=0)
    heads = torch.arange(num_kv_heads, device=tables.device).view(1, -1, 1)
    return slots.unsqueeze(1) * num_kv_heads + heads


def _host_lens(context_lens: torch.Tensor, max_context_len: Optional[int]) -> torch.Tensor:
    """Context lengths on the host for chunk sizing; on accelerators ``max_context_len`` avoids a full copy."""
    if context_lens.device.type == "cpu" or max_context_len is None:
        return context_lens.to(device="cpu", dtype=torch.int64)
    return torch.full((context_lens.shape[0],), int(max_context_len), dtype=torch.int64)


def _chunk_seqs(device: torch.device, bytes_per_seq: int) -> int:
    """Number of sequences gathered at once."""
    budget = CPU_CHUNK_BYTES if device.type == "cpu" else DEVICE_CHUNK_BYTES
    return max(1, budget // max(1, bytes_per_seq))


def _compute_dtype(query_dtype: torch.dtype, cache_dtype: torch.dtype) -> torch.dtype:
    """float32, or float64 when an input is float64 (a float8 cache counts as float32)."""
    return torch.promote_types(torch.promote_types(query_dtype, compute_dtype_of(cache_dtype)), torch.float32)


def _check_args(query, key_cache, value_cache, block_tables, context_lens) -> None:
    """Shape sanity checks (cheap, no device sync)."""
    if query.dim() != 3 or key_cache.dim() != 4 or key_cache.shape != value_cache.shape:
        shapes = f"query {tuple(query.shape)}, caches {tuple(key_cache.shape)} / {tuple(value_cache.shape)}"
        raise ValueError(f"bad shapes: {shapes}")
    num_seqs, num_heads, head_size = query.shape
    num_kv_heads = key_cache.shape[2]
    if key_cache.shape[3] != head_size or num_heads % num_kv_heads != 0:
        raise ValueError(f"query heads {num_heads}x{head_size} incompatible with cache {tuple(key_cache.shape)}")
    if block_tables.dim() != 2 or block_tables.shape[0] != num_seqs or context_lens.shape != (num_seqs,):
        shapes = f"block_tables {tuple(block_tables.shape)}, context_lens {tuple(context_lens.shape)}"
        raise ValueError(f"{shapes} do not match {num_seqs} sequences")


def _check_position_bias(position_bias: Optional[torch.Tensor], query_shape, context_lens: torch.Tensor,
                         max_context_len: Optional[int]) -> Optional[torch.Tensor]:
    """The bias as given, after checking it covers every (sequence, head) and the longest context."""
    if position_bias is None:
        return None
    num_seqs, num_heads = query_shape
    if position_bias.dim() != 3 or tuple(position_bias.shape[:2]) != (num_seqs, num_heads):
        raise ValueError(f"position_bias must be [num_seqs={num_seqs}, num_heads={num_heads}, context], got "
                         f"{tuple(position_bias.shape)}")
    if context_lens.device.type == "cpu" or max_context_len is None:
        longest = int(context_lens.max()) if num_seqs else 0
    else:
        longest = int(max_context_len)
    if position_bias.shape[2] < longest:
        raise ValueError(f"position_bias covers {position_bias.shape[2]} positions, fewer than the longest "
                         f"context ({longest})")
    return position_bias
