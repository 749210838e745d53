"""The paged KV cache tensors: a device pool and a CPU swap pool per decoder layer, with swap and copy (on CUDA the
swap pool is pinned and swaps are asynchronous copies on the current stream)."""
from __future__ import annotations

import logging
import math
import mmap
from typing import List, Optional, Sequence as Seq, Tuple

import numpy as np
import torch

from seq2seq_engine.kernels import copy_blocks, swap_blocks

logger = logging.getLogger(__name__)

KVCache = Tuple[torch.Tensor, torch.Tensor]

_GIB = 1 << 30


def cache_block_bytes(num_layers: int, num_kv_heads: int, head_size: int, block_size: int,
                      dtype: torch.dtype) -> int:
    """Bytes of one block across all layers, keys and values."""
    element_size = torch.tensor([], dtype=dtype).element_size()
    return 2 * num_layers * block_size * num_kv_heads * head_size * element_size


def num_blocks_for_bytes(num_bytes: float, block_bytes: int) -> int:
    return int(num_bytes // block_bytes)


def profile_cuda_blocks(block_bytes: int, memory_utilization: float, device: torch.device) -> int:
    """Blocks that fit in the free CUDA memory left after the model loaded, keeping a margin."""
    free_bytes, total_bytes = torch.cuda.mem_get_info(device)
    usable = free_bytes - (1.0 - memory_utilization) * total_bytes
    return max(0, int(usable // block_bytes))


def lazy_zeros(shape: Tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A zero-filled CPU tensor whose memory is committed page by page as it is first written: an anonymous
    memory map is zero pages until touched, where `torch.zeros` writes every byte (and malloc'ed memory may be
    recycled and need clearing, depending on the malloc settings). A KV pool built from these costs resident memory
    for the blocks that have been used, not for its size."""
    element_size = torch.empty((), dtype=dtype).element_size()
    num_bytes = math.prod(shape) * element_size
    if num_bytes == 0:
        return torch.zeros(shape, dtype=dtype)
    buffer = np.frombuffer(mmap.mmap(-1, num_bytes), dtype=np.uint8)  # the array keeps the map alive
    return torch.from_numpy(buffer).view(dtype).view(shape)


def _zeros(shape: Tuple[int, ...], dtype: torch.dtype, device) -> torch.Tensor:
    if torch.device(device).type == "cpu":
        return lazy_zeros(shape, dtype)
    return torch.zeros(shape, dtype=dtype, device=device)


def _allocate(num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int, head_size: int,
              dtype: torch.dtype, device) -> List[KVCache]:
    shape = (num_blocks, block_size, num_kv_heads, head_size)
    return [(_zeros(shape, dtype, device), _zeros(shape, dtype, device)) for _ in range(num_layers)]


def _pinned_pool(num_layers: int, shape: Tuple[int, ...], dtype: torch.dtype) -> List[KVCache]:
    """Per-layer (key, value) views of one zeroed page-locked buffer: the CPU swap pool of a CUDA engine, so swaps
    are DMA copies that run asynchronously on the stream (one allocation: the pinned allocator rounds each up)."""
    buffer = torch.zeros((2 * num_layers, *shape), dtype=dtype, pin_memory=True)
    return [(buffer[2 * layer], buffer[2 * layer + 1]) for layer in range(num_layers)]


def block_runs(pairs: Seq[Tuple[int, int]]) -> List[Tuple[int, int, int]]:
    """(src, dst, count) runs of consecutive blocks covering the (src, dst) pairs, sorted by source: each run is one
    contiguous copy."""
    runs: List[List[int]] = []
    for src, dst in sorted((int(s), int(d)) for s, d in pairs):
        last = runs[-1] if runs else None
        if last is not None and src == last[0] + last[2] and dst == last[1] + last[2]:
            last[2] += 1
        else:
            runs.append([src, dst, 1])
    return [(src, dst, count) for src, dst, count in runs]


def copy_block_runs(src: torch.Tensor, dst: torch.Tensor, runs: Seq[Tuple[int, int, int]],
                    non_blocking: bool) -> None:
    """Copy blocks src[s:s+n] -> dst[d:d+n] for each run; the caches may live on different devices."""
    if src.shape[1:] != dst.shape[1:] or src.dtype != dst.dtype:
        raise ValueError(f"block layouts differ: {tuple(src.shape)} {src.dtype} vs {tuple(dst.shape)} {dst.dtype}")
    for first_src, first_dst, count in runs:
        dst[first_dst:first_dst + count].copy_(src[first_src:first_src + count], non_blocking=non_blocking)


class CacheEngine:
    """Owns the KV tensors; block numbers come from the block manager, the data moves here."""

    def __init__(self, num_layers: int, num_kv_heads: int, head_size: int, block_size: int, num_gpu_blocks: int,
                 num_cpu_blocks: int, dtype: torch.dtype, device: torch.device) -> None:
        self.block_size = block_size
        self.device_cache = _allocate(num_layers, num_gpu_blocks, block_size, num_kv_heads, head_size, dtype,
                                      device)
        cpu_shape = (num_cpu_blocks, block_size, num_kv_heads, head_size)
        # Swaps between a CUDA pool and a pinned one are asynchronous: stream order keeps every later kernel and
        # copy after them; `synchronize` is for a host that reads the swap pool itself.
        self.async_swaps = torch.device(device).type == "cuda" and num_cpu_blocks > 0
        self.cpu_cache = (_pinned_pool(num_layers, cpu_shape, dtype) if self.async_swaps
                          else _allocate(num_layers, num_cpu_blocks, block_size, num_kv_heads, head_size, dtype, "cpu"))
        self._last_swap: Optional[torch.cuda.Event] = None
        block_bytes = cache_block_bytes(num_layers, num_kv_heads, head_size, block_size, dtype)
        logger.info("KV cache: %d device blocks (%.2f GiB) and %d CPU swap blocks (%.2f GiB) of %d tokens",
                    num_gpu_blocks, num_gpu_blocks * block_bytes / _GIB, num_cpu_blocks,
                    num_cpu_blocks * block_bytes / _GIB, block_size)

    @staticmethod
    def _mapping(pairs: Seq[Tuple[int, int]]) -> torch.Tensor:
        return torch.tensor(pairs, dtype=torch.int64).view(-1, 2)

    def swap_out(self, pairs: Seq[Tuple[int, int]]) -> None:
        if pairs and self.async_swaps:
            self._swap_async(pairs, to_cpu=True)
        elif pairs:
            mapping = self._mapping(pairs)
            for (device_k, device_v), (cpu_k, cpu_v) in zip(self.device_cache, self.cpu_cache):
                swap_blocks(device_k, cpu_k, mapping)
                swap_blocks(device_v, cpu_v, mapping)

    def swap_in(self, pairs: Seq[Tuple[int, int]]) -> None:
        if pairs and self.async_swaps:
            self._swap_async(pairs, to_cpu=False)
        elif pairs:
            mapping = self._mapping(pairs)
            for (device_k, device_v), (cpu_k, cpu_v) in zip(self.device_cache, self.cpu_cache):
                swap_blocks(cpu_k, device_k, mapping)
                swap_blocks(cpu_v, device_v, mapping)

    def copy(self, pairs: Seq[Tuple[int, int]]) -> None:
        if pairs:
            copy_blocks([k for k, _ in self.device_cache], [v for _, v in self.device_cache],
                        self._mapping(pairs).to(self.device_cache[0][0].device))

    def _swap_async(self, pairs: Seq[Tuple[int, int]], to_cpu: bool) -> None:
        """Device <-> pinned pool copies with non_blocking=True, one per run of consecutive blocks and tensor."""
        runs = block_runs(pairs)
        for device_kv, cpu_kv in zip(self.device_cache, self.cpu_cache):
            for device_tensor, cpu_tensor in zip(device_kv, cpu_kv):
                if to_cpu:
                    copy_block_runs(device_tensor, cpu_tensor, runs, non_blocking=True)
                else:
                    copy_block_runs(cpu_tensor, device_tensor, runs, non_blocking=True)
        self._last_swap = torch.cuda.Event()
        self._last_swap.record()

    def synchronize(self) -> None:
        """Wait until every swap issued so far has landed (before the host reads `cpu_cache`); a no-op on the CPU."""
        if self._last_swap is not None:
            self._last_swap.synchronize()
            self._last_swap = None
