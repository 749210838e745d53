"""Attention/cache kernels: paged KV writes, paged decode attention, block copies and swaps."""
