"""Attention/cache kernels: paged KV writes, paged decode attention, block copies and swaps."""
from .cache_ops import copy_blocks, reshape_and_cache, swap_blocks
from .decode_attention import paged_attention

__all__ = ["copy_blocks", "paged_attention", "reshape_and_cache", "swap_blocks"]
