"""The candidates of linear_kernels.py --mode builds: a kernel build or a capped library, each in its own process."""
from __future__ import annotations

import json
import os
import subprocess
import time

from benchmarks.lib.launch import ROOT, script_command

TORCH_AVX2 = {"ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "FBGEMM_ENABLE_INSTRUCTIONS": "AVX2"}
# candidate -> (environment of its child, what it times)
BUILD_CANDIDATES = {
    "panels-avx512": ({}, "panels"), "panels-avx2": ({"SEQ2SEQ_ENGINE_NATIVE_MARCH": "x86-64-v3"}, "panels"),
    "bf16w-avx512": ({}, "bf16w"), "bf16w-avx2": ({"SEQ2SEQ_ENGINE_NATIVE_MARCH": "x86-64-v3"}, "bf16w"),
    "F.linear-avx2": (TORCH_AVX2, "f.linear"), "onednn-avx2": (TORCH_AVX2, "onednn"),
    "int8-avx512": ({}, "int8"), "int8-avxvnni": ({"SEQ2SEQ_ENGINE_NATIVE_MARCH": "alderlake"}, "int8"),
    "int8-avx2": ({"SEQ2SEQ_ENGINE_NATIVE_MARCH": "x86-64-v3"}, "int8"), "fbgemm-avx2": (TORCH_AVX2, "fbgemm")}
# (rows, K, N): decode steps of 1, 8 and 32 rows on a Marian/BART-size model's linears and a 58000-word head, and
# one 512-row prefill
SHAPES = [(rows, k, n) for rows in (1, 8, 32) for k, n in ((512, 512), (2048, 512), (512, 2048), (768, 3072),
                                                           (512, 58000))] + [(512, 768, 768)]
EVICT_BYTES = 96 * 1024 * 1024      # --cold: three times the 32 MiB L3 of the machines this ran on


def _fbgemm(x, weight):
    """fbgemm's dynamic int8 linear on the per-channel int8 weight, activations quantized to 7 bits (reduce_range)."""
    import warnings

    import torch

    from seq2seq_engine.models.int8 import quantize_weight
    qweight, scale = quantize_weight(weight)
    torch.backends.quantized.engine = "fbgemm"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        qtensor = torch._make_per_channel_quantized_tensor(qweight, scale.double(),
                                                           torch.zeros_like(scale, dtype=torch.int64), 0)
    packed = torch.ops.quantized.linear_prepack(qtensor, None)
    return lambda: torch.ops.quantized.linear_dynamic(x, packed, True)


def _kernel(kind: str, x, weight):
    """A no-argument callable computing x W^T with `kind` (weights prepared outside the timing)."""
    import torch
    import torch.nn.functional as F
    if kind in ("panels", "bf16w"):
        from seq2seq_engine.kernels.native_linear import panel_linear, to_panels
        panels = to_panels(weight, dtype=torch.bfloat16 if kind == "bf16w" else torch.float32)
        return lambda: panel_linear(x, panels, weight.shape[0])
    if kind == "int8":
        from seq2seq_engine.kernels.native_int8 import int8_panel_linear, to_int8_panels
        from seq2seq_engine.models.int8 import quantize_weight
        packed = to_int8_panels(*quantize_weight(weight))
        return lambda: int8_panel_linear(x, packed)
    if kind == "f.linear":
        return lambda: F.linear(x, weight)
    if kind == "onednn":
        from seq2seq_engine.models.packed_linear import PackedLinear
        layer = PackedLinear(weight, panels=False)
        return lambda: layer(x)
    return _fbgemm(x, weight)


def _isa(kind: str) -> str:
    if kind in ("panels", "bf16w"):
        from seq2seq_engine.kernels.native_linear import panel_linear_isa
        return panel_linear_isa()
    if kind == "int8":
        from seq2seq_engine.kernels.native_int8 import int8_linear_isa
        return int8_linear_isa()
    return "torch"


def worker(kind: str, calls: int, cold: bool, threads: int, quick: bool) -> None:
    """Times every shape with one kernel in this process; prints {"isa":..., "times": [us per shape]} as JSON."""
    import seq2seq_engine  # noqa: F401,I001 - its OpenMP defaults before torch

    # isort: split
    import torch
    torch.set_num_threads(threads)
    evict = torch.ones(EVICT_BYTES // 4) if cold else None
    times = []
    for rows, k, n in SHAPES[:1] if quick else SHAPES:
        generator = torch.Generator().manual_seed(rows * 7 + k + n)
        weight = torch.randn(n, k, generator=generator) * k ** -0.5
        run = _kernel(kind, torch.randn(rows, k, generator=generator), weight)
        run()
        best = float("inf")
        for _ in range(calls):
            if evict is not None:
                evict.add_(1.0)
            start = time.perf_counter()
            run()
            best = min(best, time.perf_counter() - start)
        times.append(best * 1e6)
    print(json.dumps({"isa": _isa(kind), "times": times}))


def run_builds(args) -> int:
    """linear_kernels.py --mode builds: every candidate in its own child process (--worker), one table."""
    from benchmarks.lib.common import print_run_header
    print_run_header(args.threads)
    print(f"threads={args.threads} calls={args.calls} cold={args.cold}\n")
    columns = {}
    for name in args.candidates.split(","):
        if name not in BUILD_CANDIDATES:
            raise SystemExit(f"unknown candidate {name!r}: choose from {', '.join(BUILD_CANDIDATES)}")
        env, kind = BUILD_CANDIDATES[name]
        command = script_command("linear_kernels", "--mode", "builds", "--worker", kind, "--calls", str(args.calls),
                                 "--threads", str(args.threads))
        command += ["--cold"] * args.cold + ["--quick"] * args.quick
        result = subprocess.run(command, cwd=ROOT, env=dict(os.environ, **env), capture_output=True, text=True)
        if result.returncode != 0:
            print(f"{name}: failed\n{result.stderr[-2000:]}")
            continue
        report = json.loads(result.stdout.strip().splitlines()[-1])
        columns[f"{name} ({report['isa']})" if kind in ("panels", "bf16w", "int8") else name] = report["times"]
    print("| rows | K -> N | " + " | ".join(columns) + " |")
    print("|---:|---|" + "---:|" * len(columns))
    for index, (rows, k, n) in enumerate(SHAPES[:len(next(iter(columns.values()), []))]):
        print(f"| {rows} | {k} -> {n} | " + " | ".join(f"{times[index]:.0f}" for times in columns.values()) + " |")
    return 0
