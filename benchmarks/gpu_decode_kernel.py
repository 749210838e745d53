"""The Triton paged decode attention kernel on a CUDA GPU, per shape: its tile, warp and split-K settings swept
(coordinate search from the built-in heuristic), each checked against a float32 reference and timed against torch
SDPA over the same K/V laid out densely (what HF's decode reads); microseconds and effective GB/s.

    python3 -m benchmarks.gpu_decode_kernel --out decode_kernel.json
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any, Dict, List, Optional

import seq2seq_engine  # noqa: F401,I001 - first: its OpenMP defaults must precede torch

# isort: split
import torch

# name: (sequences, query heads, kv heads, head size, context length, table width in blocks of 16)
SHAPES = {
    "whisper-cross-128": (128, 20, 20, 64, 1500, 94),
    "whisper-cross-8": (8, 20, 20, 64, 1500, 94),
    "whisper-self-128": (128, 20, 20, 64, 64, 28),
    "llama-gqa-64": (64, 9, 3, 64, 1024, 64),
    "bart-self-256": (256, 16, 16, 64, 40, 64),
}
BLOCK_SIZE = 16
TILES, WARPS, SPLITS = (16, 32, 64, 128), (2, 4, 8), (1, 2, 4, 8, 16)


def make_inputs(shape, dtype: torch.dtype, seed: int = 0) -> Dict[str, Any]:
    """Random query and caches, every sequence's blocks shuffled through the pool (a paged layout)."""
    seqs, heads, kv_heads, head_size, context, width = shape
    generator = torch.Generator(device="cuda").manual_seed(seed)
    num_blocks = seqs * width + 1
    cache_shape = (num_blocks, BLOCK_SIZE, kv_heads, head_size)
    key_cache = torch.randn(cache_shape, generator=generator, device="cuda").to(dtype)
    value_cache = torch.randn(cache_shape, generator=generator, device="cuda").to(dtype)
    tables = torch.randperm(num_blocks - 1, generator=generator, device="cuda")[:seqs * width] + 1
    return {"query": torch.randn(seqs, heads, head_size, generator=generator, device="cuda").to(dtype),
            "key_cache": key_cache, "value_cache": value_cache,
            "block_tables": tables.view(seqs, width).to(torch.int32),
            "context_lens": torch.full((seqs,), context, dtype=torch.int32, device="cuda"),
            "scale": 1.0 / math.sqrt(head_size)}


def dense(inputs: Dict[str, Any], context: int):
    """K and V of every sequence gathered densely: [seqs, kv heads, context, head size]."""
    tables, blocks_used = inputs["block_tables"], -(-context // BLOCK_SIZE)
    rows = tables[:, :blocks_used].long()

    def gather(cache):
        gathered = cache[rows]                                  # [seqs, blocks, block, kv heads, head]
        return gathered.flatten(1, 2)[:, :context].transpose(1, 2).contiguous()
    return gather(inputs["key_cache"]), gather(inputs["value_cache"])


def sdpa(query, key, value, scale):
    """Decode attention as HF runs it: SDPA of one query row per sequence over dense K/V, heads grouped."""
    q = query.unsqueeze(2)                                      # [seqs, heads, 1, head size]
    return torch.nn.functional.scaled_dot_product_attention(q, key, value, scale=scale,
                                                            enable_gqa=key.shape[1] != q.shape[1]).squeeze(2)


def time_us(fn) -> float:
    import triton.testing
    return triton.testing.do_bench(fn, warmup=10, rep=40) * 1000.0


def run_config(inputs, reference, settings: Dict[str, Optional[int]], bytes_read: int) -> Dict[str, Any]:
    from seq2seq_engine.kernels.triton_attention import paged_decode_attention

    kwargs = {k: v for k, v in settings.items() if v is not None}

    def call():
        return paged_decode_attention(inputs["query"], inputs["key_cache"], inputs["value_cache"],
                                      inputs["block_tables"], inputs["context_lens"], inputs["scale"], **kwargs)
    try:
        error = (call().float() - reference).abs().max().item()
        micros = time_us(call)
    except (TypeError, ValueError, RuntimeError) as failure:   # an override this build lacks, or a bad setting
        return {"settings": settings, "error": f"{type(failure).__name__}: {failure}"[:200]}
    return {"settings": settings, "us": micros, "gb_s": bytes_read / micros / 1e3, "max_error": error}


def sweep_shape(name: str, shape, dtype: torch.dtype) -> Dict[str, Any]:
    inputs = make_inputs(shape, dtype)
    seqs, heads, kv_heads, head_size, context, _ = shape
    key, value = dense(inputs, context)
    reference = sdpa(inputs["query"].float(), key.float(), value.float(), inputs["scale"])
    bytes_read = 2 * seqs * kv_heads * context * head_size * key.element_size()
    peer_us = time_us(lambda: sdpa(inputs["query"], key, value, inputs["scale"]))
    results: List[Dict[str, Any]] = []

    def best_of(candidates):
        runs = [run_config(inputs, reference, c, bytes_read) for c in candidates]
        results.extend(runs)
        timed = [r for r in runs if "us" in r]
        return min(timed, key=lambda r: r["us"])["settings"] if timed else candidates[0]
    base = {"tile": None, "num_warps": None, "num_splits": None}
    best = best_of([base] + [dict(base, tile=t) for t in TILES])
    best = best_of([dict(best, num_warps=w) for w in WARPS])
    best = best_of([dict(best, num_splits=s) for s in SPLITS])
    fastest = min((r for r in results if "us" in r), key=lambda r: r["us"], default=None)
    default = results[0]
    return {"shape": dict(zip(("seqs", "heads", "kv_heads", "head_size", "context", "table_blocks"), shape)),
            "sdpa_dense_us": peer_us, "sdpa_dense_gb_s": bytes_read / peer_us / 1e3, "default": default,
            "fastest": fastest, "runs": results}


def table(results: Dict[str, Any]) -> str:
    lines = ["| shape | SDPA dense us (GB/s) | ours default us (GB/s) | fastest us (GB/s) | fastest settings | "
             "default / fastest vs SDPA | max error |", "|---|---|---|---|---|---|---|"]
    for name, r in results.items():
        d, f = r["default"], r["fastest"] or {}
        if "us" not in d or not f:
            lines.append(f"| {name} | {r['sdpa_dense_us']:.1f} | {d.get('error', '')} | | | | |")
            continue
        lines.append(f"| {name} | {r['sdpa_dense_us']:.1f} ({r['sdpa_dense_gb_s']:.0f}) | {d['us']:.1f} "
                     f"({d['gb_s']:.0f}) | {f['us']:.1f} ({f['gb_s']:.0f}) | {f['settings']} | "
                     f"{r['sdpa_dense_us'] / d['us']:.2f}x / {r['sdpa_dense_us'] / f['us']:.2f}x | "
                     f"{max(d['max_error'], f['max_error']):.1e} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA GPU: nothing to measure", file=sys.stderr)
        return 1
    results = {}
    for name in args.shapes.split(","):
        results[name] = sweep_shape(name, SHAPES[name], getattr(torch, args.dtype))
        print(f"{name}: default {results[name]['default']}, fastest {results[name]['fastest']}, "
              f"SDPA {results[name]['sdpa_dense_us']:.1f} us", flush=True)
        if args.out:
            with open(args.out, "w") as f:
                json.dump({"device": torch.cuda.get_device_name(0), "dtype": args.dtype, "results": results}, f,
                          indent=1)
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
