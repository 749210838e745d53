"""Micro-benchmark: paged_attention vs dense SDPA on contiguous K/V (python -m seq2seq_engine.kernels.benchmark)."""
from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from .decode_attention import paged_attention


def _time_ms(fn, repeats: int) -> tuple[float, float]:
    """(best, median) milliseconds per call after one warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    times.sort()
    return times[0], times[len(times) // 2]


def _paged_inputs(args, dtype: torch.dtype):
    """Random caches with every sequence's blocks scattered by a random permutation."""
    blocks_per_seq = -(-args.context // args.block_size)
    num_blocks = args.batch * blocks_per_seq + 1
    shape = (num_blocks, args.block_size, args.kv_heads, args.head_size)
    key_cache, value_cache = torch.randn(shape, dtype=dtype), torch.randn(shape, dtype=dtype)
    tables = torch.randperm(num_blocks)[: args.batch * blocks_per_seq].view(args.batch, -1).to(torch.int32)
    lens = torch.full((args.batch,), args.context, dtype=torch.int32)
    query = torch.randn(args.batch, args.heads, args.head_size, dtype=dtype)
    return query, key_cache, value_cache, tables, lens


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    for name, default in [("batch", 64), ("heads", 12), ("kv_heads", 12), ("head_size", 64),
                          ("context", 1500), ("block_size", 16), ("repeats", 10), ("threads", 0)]:
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=default)
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    torch.manual_seed(0)
    query, key_cache, value_cache, tables, lens = _paged_inputs(args, dtype)
    scale = args.head_size**-0.5
    paged = _time_ms(lambda: paged_attention(query, key_cache, value_cache, tables, lens, scale), args.repeats)
    dense_shape = (args.batch, args.heads, args.context, args.head_size)
    keys, values = torch.randn(dense_shape, dtype=dtype), torch.randn(dense_shape, dtype=dtype)
    q4 = query.unsqueeze(2)
    dense = _time_ms(lambda: F.scaled_dot_product_attention(q4, keys, values, scale=scale), args.repeats)
    print(f"threads={torch.get_num_threads()} {vars(args)}")
    print(f"paged_attention: best {paged[0]:.1f} ms, median {paged[1]:.1f} ms")
    print(f"dense SDPA     : best {dense[0]:.1f} ms, median {dense[1]:.1f} ms")


if __name__ == "__main__":
    main()
