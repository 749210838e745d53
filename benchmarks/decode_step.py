"""Time of one decode step's float32 linear layers, run in order as the decoder runs them, on both packings.

    .venv/bin/python benchmarks/decode_step.py                          # t5,marian,whisper; 1-256 rows; 5 rounds
    .venv/bin/python benchmarks/decode_step.py --models t5 --rows 8,32,128 --rounds 9
    .venv/bin/python benchmarks/decode_step.py --quick                  # smoke run: a small decoder, one round

A decode step multiplies one row per running sequence by every decoder weight once (self-attention q/k/v and
output, cross-attention query and output, feed-forward, per layer; then the logits head). Every weight is its own
tensor, so the step streams them from memory as a model does and no flush is needed; `int8_matmul.py --cold` times
the same shapes one at a time instead. Candidates: `onednn` (PackedLinear on oneDNN's reordered weight) and
`panels` (PackedLinear on the native panel kernel, when it built), interleaved in every round; a cell is the fastest
step over the rounds. GB/s is the step's weight bytes over its time (the bound is the machine's memory bandwidth
while the rows are few; with many rows the FMA rate bounds it).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Dict, List, Tuple

import seq2seq_engine  # noqa: F401,I001 - first: its OpenMP defaults must precede torch

# isort: split
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import print_run_header  # noqa: E402

from seq2seq_engine.kernels.native_linear import panel_linear_available  # noqa: E402
from seq2seq_engine.models.packed_linear import PackedLinear  # noqa: E402

# name: (layers, the (K, N) of one decoder layer's linears in the order they run, the logits head's (K, N))
DECODERS = {
    "t5": (12, [(768, 2304), (768, 768), (768, 768), (768, 768), (768, 4096), (2048, 768)], (768, 32128)),
    "marian": (6, [(512, 1536), (512, 512), (512, 512), (512, 512), (512, 2048), (2048, 512)], (512, 58101)),
    "whisper": (6, [(512, 1536), (512, 512), (512, 512), (512, 512), (512, 2048), (2048, 512)], (512, 51865)),
    "quick": (2, [(64, 192), (64, 64), (256, 64)], (64, 1000)),
}
CANDIDATES = ("onednn", "panels")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="t5,marian,whisper", help=f"comma list of {', '.join(DECODERS)}")
    parser.add_argument("--rows", default="1,4,8,16,32,64,128,256", help="comma list of rows (running sequences)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="smoke run: a small decoder, 1 and 9 rows, one round")
    args = parser.parse_args(argv)
    if args.quick:
        args.models, args.rows, args.rounds = "quick", "1,9", 1
    return args


def step_shapes(model: str) -> List[Tuple[int, int]]:
    """(K, N) of every linear of one decode step of `model`, in order."""
    layers, per_layer, head = DECODERS[model]
    return per_layer * layers + [head]


def step_layers(model: str, panels: bool) -> List[PackedLinear]:
    """One decoder step's linears of `model` (random weights), packed for `panels` or oneDNN."""
    generator = torch.Generator().manual_seed(0)
    return [PackedLinear(torch.randn(n, k, generator=generator) * k ** -0.5, keep_weight=False, panels=panels)
            for k, n in step_shapes(model)]


def time_step(layers: List[PackedLinear], inputs: Dict[int, torch.Tensor]) -> float:
    start = time.perf_counter()
    for layer in layers:
        layer(inputs[layer.in_features])
    return time.perf_counter() - start


def measure(model: str, rows: List[int], rounds: int, candidates: Tuple[str, ...]) -> Dict[Tuple[str, int], float]:
    """Fastest step time per (candidate, rows), the candidates interleaved in every round."""
    steps = {name: step_layers(model, name == "panels") for name in candidates}
    best: Dict[Tuple[str, int], float] = {}
    for count in rows:
        inputs = {k: torch.randn(count, k) for k in {layer.in_features for layer in steps[candidates[0]]}}
        for name in candidates:                                  # untimed: first calls build and page in
            time_step(steps[name], inputs)
        for _ in range(rounds):
            for name in candidates:
                seconds = time_step(steps[name], inputs)
                best[name, count] = min(best.get((name, count), float("inf")), seconds)
    return best


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    print_run_header(args.threads)
    candidates = CANDIDATES if panel_linear_available() else ("onednn",)
    if len(candidates) == 1:
        print("panels skipped: the native panel kernel is not available here (AVX-512F and a C compiler)")
    rows = [int(value) for value in args.rows.split(",")]
    for model in args.models.split(","):
        if model not in DECODERS:
            raise SystemExit(f"unknown model {model!r}: choose from {', '.join(DECODERS)}")
        weight_bytes = sum(k * n * 4 for k, n in step_shapes(model))
        best = measure(model, rows, args.rounds, candidates)
        print(f"\n### {model}: one decode step's linears ({weight_bytes / 1e6:.0f} MB of float32 weights)")
        print("| rows | " + " | ".join(f"{name} ms | {name} GB/s" for name in candidates) + " | panels / onednn |")
        print("|---|" + "---|---|" * len(candidates) + "---|")
        for count in rows:
            cells = [f"{best[name, count] * 1e3:.3f} | {weight_bytes / best[name, count] / 1e9:.1f}"
                     for name in candidates]
            ratio = f"{best['panels', count] / best['onednn', count]:.2f}" if "panels" in candidates else ""
            print(f"| {count} | " + " | ".join(cells) + f" | {ratio} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
