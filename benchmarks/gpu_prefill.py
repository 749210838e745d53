"""The CUDA backend's prefill attention on a GPU, per shape: xformers' memory-efficient kernel over the block-diagonal
mask against torch SDPA per run of equal-shape blocks (the two paths `CudaAttentionBackend` chooses between), each
checked against the other; milliseconds per call and the ratio.

    python3 -m benchmarks.gpu_prefill --out gpu_prefill.json
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Dict, List

import seq2seq_engine  # noqa: F401,I001 - first: its OpenMP defaults must precede torch

# isort: split
import torch

from benchmarks.gpu_decode_kernel import time_us
from seq2seq_engine.attention.backends.cuda_backend import CudaAttentionBackend
from seq2seq_engine.attention.bias import BlockDiagonalCausalMask, BlockDiagonalMask

# name: (mask kind, query lengths, key lengths (None: the same), query heads, kv heads, head size)
SHAPES = {
    "whisper-large-v3-encoder-8": ("full", [1500] * 8, None, 20, 20, 64),
    "whisper-large-v3-cross-prefill-64": ("full", [4] * 64, [1500] * 64, 20, 20, 64),
    "bart-large-encoder-mixed-16": ("full", [200, 512, 37, 1024, 90, 300, 64, 700] * 2, None, 16, 16, 64),
    "llama-gqa-causal-mixed-8": ("causal", [13, 250, 1024, 77, 512, 6, 300, 40], None, 32, 8, 64),
}


def _bias(kind: str, q_lens: List[int], k_lens):
    if kind == "causal":
        return BlockDiagonalCausalMask.from_seqlens(q_lens)
    return BlockDiagonalMask.from_seqlens(q_lens, k_lens)


def measure(name: str, dtype: torch.dtype) -> Dict[str, object]:
    kind, q_lens, k_lens, heads, kv_heads, head_size = SHAPES[name]
    bias = _bias(kind, q_lens, k_lens)
    generator = torch.Generator(device="cuda").manual_seed(0)
    num_q, num_k = sum(q_lens), sum(k_lens or q_lens)
    query = torch.randn(num_q, heads, head_size, generator=generator, device="cuda").to(dtype)
    key = torch.randn(num_k, kv_heads, head_size, generator=generator, device="cuda").to(dtype)
    value = torch.randn(num_k, kv_heads, head_size, generator=generator, device="cuda").to(dtype)
    scale = 1.0 / math.sqrt(head_size)
    backends = {"xformers": CudaAttentionBackend("xformers"), "sdpa": CudaAttentionBackend("sdpa")}
    outputs = {label: b.prefill_attention(query, key, value, bias, scale) for label, b in backends.items()}
    max_diff = float((outputs["xformers"].float() - outputs["sdpa"].float()).abs().max())
    times = {label: time_us(lambda b=b: b.prefill_attention(query, key, value, bias, scale)) / 1000.0
             for label, b in backends.items()}
    return dict(shape=name, xformers_ms=times["xformers"], sdpa_ms=times["sdpa"],
                sdpa_over_xformers=times["sdpa"] / times["xformers"], max_abs_diff=max_diff)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--out", default=None, help="JSON file of the results")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("gpu_prefill: no CUDA GPU here; nothing measured")
        return
    from seq2seq_engine.platforms.cuda import probe_xformers
    usable, note = probe_xformers()
    if not usable:
        print(f"gpu_prefill: xformers cannot run here ({note}); nothing measured")
        sys.exit(1)
    rows = [measure(name, getattr(torch, args.dtype)) for name in SHAPES]
    print(f"{torch.cuda.get_device_name()}, {args.dtype}, {note}\n")
    print("| shape | xformers ms | SDPA ms | SDPA / xformers | max abs diff |")
    print("|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['shape']} | {row['xformers_ms']:.3f} | {row['sdpa_ms']:.3f} | "
              f"{row['sdpa_over_xformers']:.2f}x | {row['max_abs_diff']:.1e} |")
    if args.out:
        with open(args.out, "w") as out:
            json.dump(rows, out, indent=1)


if __name__ == "__main__":
    main()
