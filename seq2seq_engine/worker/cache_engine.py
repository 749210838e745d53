"""The paged KV cache tensors: a device pool and a CPU swap pool per decoder layer, with swap and copy."""
from __future__ import annotations

import logging
import math
import mmap
from typing import List, Sequence as Seq, Tuple

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


class CacheEngine:
    """Owns the KV tensors; block numbers come from the block manager, the data moves here."""

    def __init__(self, num_layers: int, num_kv_heads: int, head_size: int, block_size: int, num_gpu_blocks: int,
                 num_cpu_blocks: int, dtype: torch.dtype, device: torch.device) -> None:
        self.block_size = block_size
        self.device_cache = _allocate(num_layers, num_gpu_blocks, block_size, num_kv_heads, head_size, dtype,
                                      device)
        self.cpu_cache = _allocate(num_layers, num_cpu_blocks, block_size, num_kv_heads, head_size, dtype, "cpu")
        block_bytes = cache_block_bytes(num_layers, num_kv_heads, head_size, block_size, dtype)
        logger.info("KV cache: %d device blocks (%.2f GiB) and %d CPU swap blocks (%.2f GiB) of %d tokens",
                    num_gpu_blocks, num_gpu_blocks * block_bytes / _GIB, num_cpu_blocks,
                    num_cpu_blocks * block_bytes / _GIB, block_size)

    @staticmethod
    def _mapping(pairs: Seq[Tuple[int, int]]) -> torch.Tensor:
        return torch.tensor(pairs, dtype=torch.int64).view(-1, 2)

    def swap_out(self, pairs: Seq[Tuple[int, int]]) -> None:
        if pairs:
            mapping = self._mapping(pairs)
            for (device_k, device_v), (cpu_k, cpu_v) in zip(self.device_cache, self.cpu_cache):
                swap_blocks(device_k, cpu_k, mapping)
                swap_blocks(device_v, cpu_v, mapping)

    def swap_in(self, pairs: Seq[Tuple[int, int]]) -> None:
        if pairs:
            mapping = self._mapping(pairs)
            for (device_k, device_v), (cpu_k, cpu_v) in zip(self.device_cache, self.cpu_cache):
                swap_blocks(cpu_k, device_k, mapping)
                swap_blocks(cpu_v, device_v, mapping)

    def copy(self, pairs: Seq[Tuple[int, int]]) -> None:
        if pairs:
            copy_blocks([k for k, _ in self.device_cache], [v for _, v in self.device_cache],
                        self._mapping(pairs).to(self.device_cache[0][0].device))
