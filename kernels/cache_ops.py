"""Paged KV-cache maintenance ops: write new tokens, copy blocks (copy-on-write), swap blocks between devices."""
from __future__ import annotations

import ctypes
import functools
import logging
from typing import Any, Optional, Sequence

import torch

from seq2seq_engine.platforms import current_platform

from .cache_dtype import storage_view, to_cache_dtype
from .native import load_library, tensor_ptr

logger = logging.getLogger(__name__)


def reshape_and_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Write ``key``/``value`` ``[num_tokens, num_kv_heads, head_size]`` into the caches in place.

    Caches are ``[num_blocks, block_size, num_kv_heads, head_size]``; token ``i`` goes to slot
    ``slot_mapping[i]`` (block ``s // block_size``, offset ``s % block_size``). Negative slots are skipped
    (padding tokens). Values are cast to the cache dtype (float8 saturates: kernels/cache_dtype.py). Works for any
    cache strides (no flattened copy).
    On CPU, with matching dtypes, contiguous caches and each token's heads contiguous, the rows are copied by
    ``csrc/cache_write_cpu.c``; on CUDA the Triton writer runs where the CUDA platform chose it (no host sync);
    anything else takes the torch path (which reads the slots back on a device to drop negative ones).
    """
    if key.shape != value.shape or key.dim() != 3 or key.shape[0] != slot_mapping.shape[0]:
        raise ValueError(f"key {tuple(key.shape)} / value {tuple(value.shape)} / slots {tuple(slot_mapping.shape)}")
    if key.shape[1:] != key_cache.shape[2:] or key_cache.shape != value_cache.shape:
        raise ValueError(f"tokens {tuple(key.shape)} do not fit caches {tuple(key_cache.shape)}")
    triton = _triton_cache_ops() if key_cache.is_cuda and key.is_cuda and slot_mapping.is_cuda else None
    if triton is not None:
        triton.write_to_paged_cache(key, value, key_cache, value_cache, slot_mapping)
        return
    library = _native_writer(key, value, key_cache, value_cache, slot_mapping)
    if library is not None:
        _write_native(library, key, value, key_cache, value_cache, slot_mapping.to(torch.int64).contiguous())
        return
    device = key_cache.device
    slots = slot_mapping.to(device=device, dtype=torch.int64)
    key = storage_view(to_cache_dtype(key.to(device), key_cache.dtype))
    value = storage_view(to_cache_dtype(value.to(device), value_cache.dtype))
    key_cache, value_cache = storage_view(key_cache), storage_view(value_cache)
    keep = slots >= 0
    if not bool(keep.all()):
        slots, key, value = slots[keep], key[keep], value[keep]
    if key_cache.is_contiguous() and value_cache.is_contiguous():
        # One row copy per token into the [num_blocks * block_size, heads * head_size] view of each cache: on
        # 2-D rows torch's index_copy_ copies whole rows, on 3-D ones it walks elements (7x slower at 256 rows).
        width = key_cache.shape[2] * key_cache.shape[3]
        key_cache.view(-1, width).index_copy_(0, slots, key.reshape(-1, width))
        value_cache.view(-1, width).index_copy_(0, slots, value.reshape(-1, width))
        return
    block_size = key_cache.shape[1]
    index = (torch.div(slots, block_size, rounding_mode="floor"), slots % block_size)
    key_cache.index_put_(index, key)
    value_cache.index_put_(index, value)


def _native_writer(key, value, key_cache, value_cache, slot_mapping) -> Optional[ctypes.CDLL]:
    """The native writer where it applies to these tensors, else None."""
    tensors = (key, value, key_cache, value_cache, slot_mapping)
    if any(t.device.type != "cpu" for t in tensors) or key.shape[0] == 0:
        return None
    if key.dtype != key_cache.dtype or value.dtype != value_cache.dtype or key.dtype != value.dtype:
        return None
    if not (key_cache.is_contiguous() and value_cache.is_contiguous()) or slot_mapping.dim() != 1:
        return None
    head_size = key.shape[2]
    if any(t.stride(2) != 1 or t.stride(1) != head_size for t in (key, value)):
        return None
    return load_library("cache_write_cpu")


def _write_native(library, key, value, key_cache, value_cache, slots) -> None:
    element = key.element_size()
    row_bytes = key.shape[1] * key.shape[2] * element
    num_slots = key_cache.shape[0] * key_cache.shape[1]
    failed = library.write_kv_slots(
        tensor_ptr(key), ctypes.c_int64(key.stride(0) * element), tensor_ptr(value),
        ctypes.c_int64(value.stride(0) * element), tensor_ptr(key_cache), tensor_ptr(value_cache), tensor_ptr(slots),
        ctypes.c_int64(key.shape[0]), ctypes.c_int64(row_bytes), ctypes.c_int64(num_slots),
        ctypes.c_int(torch.get_num_threads()))
    if failed:
        raise ValueError(f"slot_mapping: slot {int(slots.max())} is past the cache's {num_slots} slots")


def copy_blocks(
    key_caches: Sequence[torch.Tensor],
    value_caches: Sequence[torch.Tensor],
    block_mapping: torch.Tensor,
) -> None:
    """Copy whole blocks ``src -> dst`` inside every layer's key and value cache (copy-on-write).

    ``block_mapping`` is int ``[num_pairs, 2]`` of (src, dst). All sources are read before any destination is
    written; destinations must be distinct from each other.
    """
    if len(key_caches) != len(value_caches):
        raise ValueError(f"{len(key_caches)} key caches vs {len(value_caches)} value caches")
    pairs = _as_pairs(block_mapping)
    if pairs.shape[0] == 0:
        return
    caches = list(key_caches) + list(value_caches)
    triton = _triton_cache_ops() if caches and all(cache.is_cuda for cache in caches) else None
    if triton is not None:
        triton.copy_paged_blocks(list(key_caches), list(value_caches), pairs.to(caches[0].device))
        return
    for cache in map(storage_view, caches):
        src, dst = _pair_indices(pairs, cache.device)
        cache.index_copy_(0, dst, cache.index_select(0, src))


def swap_blocks(src: torch.Tensor, dst: torch.Tensor, block_mapping: torch.Tensor) -> None:
    """Copy blocks ``src_cache[s] -> dst_cache[d]`` for each (s, d) pair; the caches may live on different devices.

    Used to move blocks between the device cache and the CPU swap pool. Blocking copy, so the data is in
    place when this returns.
    """
    if src.shape[1:] != dst.shape[1:] or src.dtype != dst.dtype:
        raise ValueError(f"block layouts differ: {tuple(src.shape)} {src.dtype} vs {tuple(dst.shape)} {dst.dtype}")
    pairs = _as_pairs(block_mapping)
    if pairs.shape[0] == 0:
        return
    src_index, _ = _pair_indices(pairs, src.device)
    _, dst_index = _pair_indices(pairs, dst.device)
    blocks = storage_view(src).index_select(0, src_index).to(dst.device)
    storage_view(dst).index_copy_(0, dst_index, blocks)


@functools.lru_cache(maxsize=None)
def _triton_cache_ops() -> Optional[Any]:
    """kernels/triton_cache.py where the CUDA platform chose the Triton kernels and it loads, else None."""
    if current_platform("cuda").paged_kernels != "triton":
        return None
    try:
        from . import triton_cache
    except ImportError as error:
        logger.warning("the Triton KV-cache kernels do not load (%s): cache writes run the torch path", error)
        return None
    return triton_cache


def _as_pairs(block_mapping) -> torch.Tensor:
    """Normalise a mapping (tensor or sequence of pairs) to an int64 ``[num_pairs, 2]`` tensor."""
    pairs = torch.as_tensor(block_mapping, dtype=torch.int64)
    if pairs.numel() == 0:
        return pairs.reshape(0, 2)
    if pairs.dim() != 2 or pairs.shape[1] != 2:
        raise ValueError(f"block_mapping must be [num_pairs, 2], got {tuple(pairs.shape)}")
    return pairs


def _pair_indices(pairs: torch.Tensor, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(src, dst) index vectors on ``device``."""
    pairs = pairs.to(device)
    return pairs[:, 0], pairs[:, 1]
