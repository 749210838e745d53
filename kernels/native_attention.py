"""ctypes front end of the fused CPU paged decode attention in csrc/paged_attention_cpu.c."""
from __future__ import annotations

import ctypes
from typing import Optional

import torch

from .native import DTYPE_CODES, load_library, tensor_ptr

_STATUS_ERRORS = {1: "a block table entry is outside the KV cache", 2: "out of memory in the native kernel"}
_OVER_CAPACITY = 3


def paged_attention_isa() -> str:
    """The code path the native paged attention kernel was built with here: "avx512" or "avx2" (register
    tiles), "portable" (compiler-vectorised loops), or "none" where it did not build."""
    library = load_library("paged_attention_cpu")
    if library is None:
        return "none"
    library.paged_attention_isa.restype = ctypes.c_char_p
    return library.paged_attention_isa().decode()


def native_paged_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    position_bias: Optional[torch.Tensor] = None,
) -> Optional[torch.Tensor]:
    """``paged_attention`` computed by the native kernel, or None where it does not apply (non-CPU tensors, a
    cache dtype other than float32/bfloat16, non-contiguous caches, or no compiled library) -- then the caller
    runs the torch path. Arguments were shape-checked by the caller; int32 tables and lengths (the engine's
    metadata) are passed without a copy. ``position_bias`` ``[num_seqs, num_heads, >= longest context]`` (checked
    by the caller) is added to the scaled scores."""
    if not _applies(query, key_cache, value_cache):
        return None
    library = load_library("paged_attention_cpu")
    if library is None:
        return None
    num_seqs, num_heads, head_size = query.shape
    num_blocks, block_size, num_kv_heads, _ = key_cache.shape
    q = query.to(torch.float32).contiguous()
    if block_tables.dtype != torch.int32 and block_tables.numel() and (
            int(block_tables.max()) >= 2 ** 31 or int(block_tables.min()) < -2 ** 31):
        raise ValueError(f"paged_attention: {_STATUS_ERRORS[1]} ({num_blocks} blocks)")
    tables = block_tables.to(torch.int32).contiguous()
    lens = context_lens.to(torch.int32).contiguous()
    out = torch.empty(num_seqs, num_heads, head_size, dtype=torch.float32)
    bias = None if position_bias is None else position_bias.to(device="cpu", dtype=torch.float32).contiguous()
    status = library.paged_attention_f32(
        tensor_ptr(q), tensor_ptr(key_cache), tensor_ptr(value_cache), ctypes.c_int(DTYPE_CODES[key_cache.dtype]),
        tensor_ptr(tables), tensor_ptr(lens), ctypes.c_float(scale), tensor_ptr(bias),
        ctypes.c_int64(0 if bias is None else bias.shape[2]), tensor_ptr(out),
        *(ctypes.c_int64(n) for n in (num_seqs, num_heads, num_kv_heads, head_size, block_size, tables.shape[1],
                                      num_blocks)),
        ctypes.c_int(torch.get_num_threads()))
    if status == _OVER_CAPACITY:
        raise ValueError(f"context length {int(lens.max())} exceeds the block table capacity of "
                         f"{tables.shape[1] * block_size} tokens")
    if status != 0:
        raise ValueError(f"paged_attention: {_STATUS_ERRORS.get(status, f'native kernel status {status}')} "
                         f"({num_blocks} blocks)")
    return out.to(query.dtype)


def _applies(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor) -> bool:
    tensors = (query, key_cache, value_cache)
    return (all(t.device.type == "cpu" for t in tensors) and key_cache.dtype in DTYPE_CODES
            and value_cache.dtype == key_cache.dtype and key_cache.is_contiguous() and value_cache.is_contiguous()
            and query.dtype in (torch.float32, torch.bfloat16, torch.float16) and query.shape[0] > 0)
