"""Slow, loop-based reference implementations of the cache kernels (seq2seq_engine.kernels), for test_kernels."""
from __future__ import annotations

import math
from typing import Sequence

import torch


def ref_reshape_and_cache(key, value, key_cache, value_cache, slot_mapping) -> None:
    """Write token by token; negative slots are skipped."""
    block_size = key_cache.shape[1]
    for token, slot in enumerate(slot_mapping.tolist()):
        if slot < 0:
            continue
        key_cache[slot // block_size, slot % block_size] = key[token]
        value_cache[slot // block_size, slot % block_size] = value[token]


def ref_gather_context(cache: torch.Tensor, block_table: Sequence[int], context_len: int) -> torch.Tensor:
    """Materialise ``[context_len, num_kv_heads, head_size]`` by walking one block-table row token by token."""
    block_size = cache.shape[1]
    rows = []
    for position in range(context_len):
        block = int(block_table[position // block_size])
        rows.append(cache[block, position % block_size])
    if not rows:
        return cache.new_zeros((0,) + tuple(cache.shape[2:]))
    return torch.stack(rows)


def ref_paged_attention(query, key_cache, value_cache, block_tables, context_lens, scale) -> torch.Tensor:
    """One float32 softmax per sequence and head over K/V gathered from the block table."""
    num_seqs, num_heads, head_size = query.shape
    group = num_heads // key_cache.shape[2]
    out = torch.zeros(num_seqs, num_heads, head_size, dtype=torch.float32)
    for seq in range(num_seqs):
        context_len = int(context_lens[seq])
        if context_len == 0:
            continue
        table = block_tables[seq].tolist()
        keys = ref_gather_context(key_cache, table, context_len).float()
        values = ref_gather_context(value_cache, table, context_len).float()
        for head in range(num_heads):
            kv_head = head // group
            scores = keys[:, kv_head, :] @ query[seq, head].float() * scale
            probs = torch.softmax(scores, dim=0)
            out[seq, head] = probs @ values[:, kv_head, :]
    return out.to(query.dtype)


def ref_copy_blocks(key_caches, value_caches, block_mapping) -> None:
    """Copy pair by pair, layer by layer."""
    for src, dst in block_mapping.tolist():
        for cache in list(key_caches) + list(value_caches):
            cache[dst] = cache[src].clone()


def ref_swap_blocks(src, dst, block_mapping) -> None:
    """Copy pair by pair across devices."""
    for src_block, dst_block in block_mapping.tolist():
        dst[dst_block] = src[src_block].to(dst.device)


def random_paged_cache(gen, lens, block_size, num_kv_heads, head_size, dtype):
    """(key_cache, value_cache, int32 block tables): random K/V of each sequence of `lens` scattered into shuffled
    blocks, NaN in every slot no table uses, and a spare column in the tables."""
    num_blocks = sum(math.ceil(n / block_size) for n in lens) + 3
    shape = (num_blocks, block_size, num_kv_heads, head_size)
    key_cache, value_cache = torch.full(shape, float("nan")), torch.full(shape, float("nan"))
    order = torch.randperm(num_blocks, generator=gen).tolist()
    tables = torch.zeros(len(lens), max(math.ceil(n / block_size) for n in lens) + 1, dtype=torch.int32)
    for seq, n in enumerate(lens):
        for index in range(math.ceil(n / block_size)):
            tables[seq, index] = order.pop()
        for pos in range(n):
            block, offset = int(tables[seq, pos // block_size]), pos % block_size
            key_cache[block, offset] = torch.randn(num_kv_heads, head_size, generator=gen)
            value_cache[block, offset] = torch.randn(num_kv_heads, head_size, generator=gen)
    return key_cache.to(dtype), value_cache.to(dtype), tables
