"""Triton paged KV-cache ops: write new tokens into their slots, copy blocks (copy-on-write) in every layer."""
from __future__ import annotations

from typing import Sequence

import torch

from .cache_dtype import storage_view, to_cache_dtype
from .triton_launch import check_device, kernel_for, next_power_of_two, tl, triton_available

__all__ = ["copy_paged_blocks", "triton_available", "write_to_paged_cache"]

# Elements one program copies per step.
_COPY_CHUNK = 1024


def write_to_paged_cache(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor,
                         value_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Write ``key``/``value`` ``[num_tokens, num_kv_heads, head_size]`` into the caches ``[num_blocks,
    block_size, num_kv_heads, head_size]`` in place, the contract of ``reshape_and_cache``: token ``i`` goes to
    slot ``slot_mapping[i]`` (block ``s // block_size``, offset ``s % block_size``), cast to the cache dtype; a
    negative slot (a CUDA graph's padding row) is skipped, and so is a slot past the cache on the device, where
    it cannot be checked without a sync (on the CPU it raises). One program per token, no host sync."""
    if key.dim() != 3 or key.shape != value.shape or slot_mapping.shape != (key.shape[0],):
        raise ValueError(f"key {tuple(key.shape)} and value {tuple(value.shape)} must be [num_tokens, num_kv_heads, "
                         f"head_size] alike and slot_mapping {tuple(slot_mapping.shape)} [num_tokens]")
    if key_cache.dim() != 4 or key_cache.shape != value_cache.shape or key.shape[1:] != key_cache.shape[2:]:
        raise ValueError(f"tokens {tuple(key.shape)} do not fit the caches {tuple(key_cache.shape)} / "
                         f"{tuple(value_cache.shape)}")
    if slot_mapping.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"slot_mapping must be int32 or int64, got {slot_mapping.dtype}")
    for name, tensor in (("value", value), ("key_cache", key_cache), ("value_cache", value_cache),
                         ("slot_mapping", slot_mapping)):
        check_device(name, tensor, key.device)
    if key_cache.stride(3) != 1 or value_cache.stride(3) != 1:
        raise ValueError("key_cache and value_cache must have a contiguous head_size dimension (stride 1)")
    num_tokens, num_kv_heads, head_size = key.shape
    num_slots = key_cache.shape[0] * key_cache.shape[1]
    if num_tokens == 0:
        return
    if slot_mapping.device.type == "cpu" and int(slot_mapping.max()) >= num_slots:
        raise ValueError(f"slot_mapping: slot {int(slot_mapping.max())} is past the cache's {num_slots} slots")
    # torch casts (round to nearest even on every device, float8 saturated; Triton's interpreter truncates), so the
    # kernel only copies
    key = _cast_rows(key, key_cache.dtype)
    value = _cast_rows(value, value_cache.dtype)
    kernel_for(_write_kernel, key.device)[(num_tokens,)](
        *map(storage_view, (key, value, key_cache, value_cache)), slot_mapping, num_slots, key.stride(0), key.stride(1),
        value.stride(0), value.stride(1), key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
        value_cache.stride(0), value_cache.stride(1), value_cache.stride(2),
        HEADS=num_kv_heads, HEADS_PAD=next_power_of_two(num_kv_heads), HEAD_SIZE=head_size,
        HEAD_PAD=next_power_of_two(head_size), BLOCK_SIZE=key_cache.shape[1])


def _cast_rows(tokens: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``tokens`` in the cache dtype with a contiguous head_size dimension."""
    cast = to_cache_dtype(tokens, dtype)
    return cast if cast.stride(2) == 1 else cast.contiguous()


def _write_kernel(key_ptr, value_ptr, k_cache_ptr, v_cache_ptr, slots_ptr, num_slots, key_stride_token,
                  key_stride_head, value_stride_token, value_stride_head, kc_stride_block, kc_stride_slot,
                  kc_stride_head, vc_stride_block, vc_stride_slot, vc_stride_head, HEADS: tl.constexpr,
                  HEADS_PAD: tl.constexpr, HEAD_SIZE: tl.constexpr, HEAD_PAD: tl.constexpr,
                  BLOCK_SIZE: tl.constexpr):
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slots_ptr + token).to(tl.int64)
    heads = tl.arange(0, HEADS_PAD)
    dims = tl.arange(0, HEAD_PAD)
    mask = (heads < HEADS)[:, None] & (dims < HEAD_SIZE)[None, :] & (slot >= 0) & (slot < num_slots)
    block = slot // BLOCK_SIZE
    offset = slot % BLOCK_SIZE
    k = tl.load(key_ptr + token * key_stride_token + heads[:, None] * key_stride_head + dims[None, :], mask=mask)
    k_dest = block * kc_stride_block + offset * kc_stride_slot + heads[:, None] * kc_stride_head + dims[None, :]
    tl.store(k_cache_ptr + k_dest, k, mask=mask)
    v = tl.load(value_ptr + token * value_stride_token + heads[:, None] * value_stride_head + dims[None, :],
                mask=mask)
    v_dest = block * vc_stride_block + offset * vc_stride_slot + heads[:, None] * vc_stride_head + dims[None, :]
    tl.store(v_cache_ptr + v_dest, v, mask=mask)


def copy_paged_blocks(key_caches: Sequence[torch.Tensor], value_caches: Sequence[torch.Tensor],
                      block_mapping: torch.Tensor) -> None:
    """Copy whole blocks ``src -> dst`` in every layer's key and value cache, the contract of ``copy_blocks``:
    ``block_mapping`` int ``[num_pairs, 2]`` of (src, dst) on the caches' device; all sources are read before any
    destination is written (through a staging buffer), destinations distinct. Two launches per cache, no sync."""
    if len(key_caches) != len(value_caches):
        raise ValueError(f"{len(key_caches)} key caches vs {len(value_caches)} value caches")
    if block_mapping.dim() != 2 or block_mapping.shape[1] != 2:
        raise ValueError(f"block_mapping must be [num_pairs, 2], got {tuple(block_mapping.shape)}")
    if block_mapping.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"block_mapping must be int32 or int64, got {block_mapping.dtype}")
    num_pairs = block_mapping.shape[0]
    if num_pairs == 0:
        return
    pairs = block_mapping.contiguous()
    for cache in list(key_caches) + list(value_caches):
        _copy_cache_blocks(storage_view(cache), pairs, num_pairs)


def _copy_cache_blocks(cache: torch.Tensor, pairs: torch.Tensor, num_pairs: int) -> None:
    """One cache: the source blocks into a staging buffer, then the buffer into the destination blocks."""
    check_device("block_mapping", pairs, cache.device)
    if cache.dim() < 2 or cache.shape[0] == 0 or not cache[0].is_contiguous():
        raise ValueError(f"each cache block must be contiguous, got shape {tuple(cache.shape)} strides "
                         f"{cache.stride()}")
    block_numel = cache[0].numel()
    staging = torch.empty(num_pairs, block_numel, dtype=cache.dtype, device=cache.device)
    grid = (num_pairs, -(-block_numel // _COPY_CHUNK))
    kernel = kernel_for(_copy_blocks_kernel, cache.device)
    kernel[grid](cache, staging, pairs, block_numel, cache.stride(0), block_numel, GATHER=True, CHUNK=_COPY_CHUNK)
    kernel[grid](staging, cache, pairs, block_numel, block_numel, cache.stride(0), GATHER=False, CHUNK=_COPY_CHUNK)


def _copy_blocks_kernel(src_ptr, dst_ptr, pairs_ptr, block_numel, src_stride, dst_stride, GATHER: tl.constexpr,
                        CHUNK: tl.constexpr):
    # gather: block pairs[pair, 0] of the cache to staging row pair; else staging row pair to block pairs[pair, 1]
    pair = tl.program_id(0).to(tl.int64)
    if GATHER:
        src_block = tl.load(pairs_ptr + pair * 2).to(tl.int64)
        dst_block = pair
    else:
        src_block = pair
        dst_block = tl.load(pairs_ptr + pair * 2 + 1).to(tl.int64)
    offsets = tl.program_id(1).to(tl.int64) * CHUNK + tl.arange(0, CHUNK)
    mask = offsets < block_numel
    values = tl.load(src_ptr + src_block * src_stride + offsets, mask=mask)
    tl.store(dst_ptr + dst_block * dst_stride + offsets, values, mask=mask)
