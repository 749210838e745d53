"""Micro-benchmark: paged_attention vs dense SDPA on contiguous K/V (python -m seq2seq_engine.kernels.benchmark).

With ``--layers N`` a call attends over N layers' caches in turn, as a decode step does (N caches together can
exceed the L3 that one layer's fits in). The read floor is the time to sum every cache once: the rate at which this
machine streams the same bytes from memory.
"""
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
    """Random caches (one (key, value) pair per layer) with every sequence's blocks scattered by a random
    permutation."""
    blocks_per_seq = -(-args.context // args.block_size)
    num_blocks = args.batch * blocks_per_seq + 1
    shape = (num_blocks, args.block_size, args.kv_heads, args.head_size)
    caches = [(torch.randn(shape, dtype=dtype), torch.randn(shape, dtype=dtype)) for _ in range(args.layers)]
    tables = torch.randperm(num_blocks)[: args.batch * blocks_per_seq].view(args.batch, -1).to(torch.int32)
    lens = torch.full((args.batch,), args.context, dtype=torch.int32)
    query = torch.randn(args.batch, args.heads, args.head_size, dtype=dtype)
    return query, caches, tables, lens


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    for name, default in [("batch", 64), ("heads", 12), ("kv_heads", 12), ("head_size", 64),
                          ("context", 1500), ("block_size", 16), ("repeats", 10), ("threads", 0), ("layers", 1)]:
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=default)
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    torch.manual_seed(0)
    query, caches, tables, lens = _paged_inputs(args, dtype)
    scale = args.head_size**-0.5
    paged = _time_ms(lambda: [paged_attention(query, k, v, tables, lens, scale) for k, v in caches], args.repeats)
    floor = _time_ms(lambda: [(k.sum(), v.sum()) for k, v in caches], args.repeats)
    dense_shape = (args.batch, args.heads, args.context, args.head_size)
    keys, values = torch.randn(dense_shape, dtype=dtype), torch.randn(dense_shape, dtype=dtype)
    q4 = query.unsqueeze(2)
    dense = _time_ms(lambda: [F.scaled_dot_product_attention(q4, keys, values, scale=scale)
                              for _ in range(args.layers)], args.repeats)
    print(f"threads={torch.get_num_threads()} {vars(args)}")
    print(f"paged_attention: best {paged[0]:.1f} ms, median {paged[1]:.1f} ms")
    print(f"read floor     : best {floor[0]:.1f} ms, median {floor[1]:.1f} ms (every cache summed once)")
    print(f"dense SDPA     : best {dense[0]:.1f} ms, median {dense[1]:.1f} ms (one layer's K/V, contiguous, "
          f"{args.layers} times)")


if __name__ == "__main__":
    main()
