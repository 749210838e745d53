"""Time per Linear matmul: float32 (MKL and oneDNN), bfloat16 and torch's int8 CPU kernels, on the models' shapes.

    .venv/bin/python benchmarks/int8_matmul.py                     # whisper-base shapes, 5 interleaved rounds
    .venv/bin/python benchmarks/int8_matmul.py --models whisper,bart,smollm2 --rounds 9
    .venv/bin/python benchmarks/int8_matmul.py --models marian,t5 --candidates float32,float32-onednn,float32-panels
    .venv/bin/python benchmarks/int8_matmul.py --models marian,t5 --cold --candidates float32-onednn,float32-panels
    .venv/bin/python benchmarks/int8_matmul.py --models marian,t5 --cold --candidates int8-panels,int8-fbgemm
    .venv/bin/python benchmarks/int8_matmul.py --avx2              # again with oneDNN, MKL, fbgemm and ATen on AVX2
    .venv/bin/python benchmarks/int8_matmul.py --quick             # smoke run: two small shapes, one round

Candidates (y = x W^T + b, float32 x of `rows` x K, W of N x K):
  float32        F.linear (MKL sgemm)
  float32-onednn the engine's PackedLinear on oneDNN: its linear on a weight reordered once (what float32 CPU models
                 run where the panel kernel is missing)
  float32-panels the engine's PackedLinear on the native panel kernel (kernels/native_linear.py), what float32 CPU
                 models run where it built (AVX-512)
  bfloat16       F.linear on bfloat16 x, W, b (oneDNN; x converted before timing, as in a bfloat16 model)
  int8-panels    the engine's Int8Linear on the native VNNI panel kernel (kernels/native_int8.py), what
                 quantization="int8" runs where it built (AVX-512 VNNI): per-channel int8 W, each row of x quantized
                 to int8 on its own scale inside the kernel
  int8-fbgemm    the engine's Int8Linear on fbgemm, what quantization="int8" runs elsewhere:
                 torch.ops.quantized.linear_dynamic (per-channel int8 W, x quantized per call to uint8) on x divided
                 by its rows' max |x|, the output multiplied back: one activation scale per row
  int8-fbgemm-pt the same kernel on x as it is: one activation scale for the whole input
  int8-onednn    torch.ops.onednn.qlinear_pointwise on a plain int8 W, x quantized to uint8 by torch ops per call
  int8-intmm     torch._int_mm on int8 x (symmetric, one scale per row) and int8 W, then both scales applied
  w8-bf16        torch._weight_int8pack_mm: int8 W, bfloat16 x, no activation quantization (weight-only)
  torchao        torchao's Int8DynamicActivationInt8WeightConfig in eager mode, when torchao is installed
Every candidate runs once per round on each shape, interleaved (A, B, C, A, B, C, ...); a cell is the fastest
single call over all rounds (the machine is shared: the minimum is the least disturbed). With --cold, a read of
three times the last-level cache before every timed call pushes the weights out of the caches, as in a decode step,
where a whole model's weights pass through them (without it, repeated calls find a small weight in cache). "err" is
the largest |y - y_float32| over the largest |y_float32| on random inputs, the error the quantization adds.
"""
from __future__ import annotations

import argparse
import datetime
import importlib.util
import os
import subprocess
import sys
import time
from typing import Callable, Dict, List, Tuple

AVX2_ENV = {"ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "FBGEMM_ENABLE_INSTRUCTIONS": "AVX2",
            "ATEN_CPU_CAPABILITY": "avx2"}
CANDIDATES = ("float32", "float32-onednn", "float32-panels", "bfloat16", "int8-panels", "int8-fbgemm",
              "int8-fbgemm-pt", "int8-onednn", "int8-intmm", "w8-bf16", "torchao")
# bytes read before each --cold call: three times the last-level cache (at least 96 MiB, three times the 32 MiB L3
# of the AMD VMs; the Intel Xeon VMs report 300 MiB)
MIN_EVICT_BYTES = 96 * 1024 * 1024
# (label, rows, K, N) per model: encoder (prefill) rows, then decoder rows, then the logits projection.
SHAPES: Dict[str, List[Tuple[str, int, int, int]]] = {
    "whisper": [("enc qkv", 1500, 512, 1536), ("enc out", 1500, 512, 512), ("enc fc1", 1500, 512, 2048),
                ("enc fc2", 1500, 2048, 512), ("enc fc1 x4", 6000, 512, 2048), ("dec qkv", 8, 512, 1536),
                ("dec fc1", 8, 512, 2048), ("dec fc2", 8, 2048, 512), ("dec fc1", 64, 512, 2048),
                ("dec fc2", 64, 2048, 512), ("head", 8, 512, 51865), ("head", 64, 512, 51865)],
    "bart": [("enc qkv", 2048, 768, 2304), ("enc fc1", 2048, 768, 3072), ("enc fc2", 2048, 3072, 768),
             ("dec qkv", 64, 768, 2304), ("dec fc1", 64, 768, 3072), ("dec fc2", 64, 3072, 768),
             ("head", 64, 768, 50265)],
    "smollm2": [("prefill qkv", 2048, 576, 960), ("prefill gate_up", 2048, 576, 3072),
                ("prefill down", 2048, 1536, 576), ("decode qkv", 64, 576, 960), ("decode gate_up", 64, 576, 3072),
                ("decode down", 64, 1536, 576), ("head", 64, 576, 49152)],
    "marian": [("enc qkv", 3900, 512, 1536), ("enc fc1", 3900, 512, 2048), ("enc fc2", 3900, 2048, 512),
               ("dec qkv", 256, 512, 1536), ("dec fc1", 256, 512, 2048), ("dec fc2", 256, 2048, 512),
               ("head", 256, 512, 58101), ("head", 64, 512, 58101)],
    "t5": [("enc qkv", 2700, 768, 2304), ("enc wi", 2700, 768, 4096), ("enc wo", 2700, 2048, 768),
           ("dec qkv", 32, 768, 2304), ("dec wi", 32, 768, 4096), ("dec wo", 32, 2048, 768), ("dec wi", 8, 768, 4096),
           ("head", 32, 768, 32128)],
    "quick": [("quick", 16, 256, 384), ("quick", 300, 256, 384)],
}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="whisper", help=f"comma list of {', '.join(SHAPES)}")
    parser.add_argument("--candidates", default=",".join(CANDIDATES), help="comma list (see above)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds; each times every candidate")
    parser.add_argument("--calls", type=int, default=3, help="timed calls per candidate and round")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--cold", action="store_true", help="evict the caches before every timed call (see above)")
    parser.add_argument("--avx2", action="store_true", help="re-run in a child with " +
                        " ".join(f"{k}={v}" for k, v in AVX2_ENV.items()) + " (a CPU without AVX-512/BF16/VNNI)")
    parser.add_argument("--quick", action="store_true", help="smoke run: two small shapes, one round, one call")
    args = parser.parse_args(argv)
    if args.quick:
        args.models, args.rounds, args.calls = "quick", 1, 1
    return args


# ------------------------------------------------------------------------------------------- candidates
def _quantized(weight):
    from seq2seq_engine.models.int8 import quantize_weight
    return quantize_weight(weight)


def _onednn(x, weight, bias) -> Callable:
    import torch
    qweight, scale = _quantized(weight)
    packed = torch.ops.onednn.qlinear_prepack(qweight, list(x.shape))
    zeros = torch.zeros(weight.shape[0], dtype=torch.int64)

    def run():
        low, high = torch.aminmax(x)
        low, high = min(low.item(), 0.0), max(high.item(), 0.0)
        x_scale = max(high - low, 1e-8) / 255.0
        zero_point = int(round(-low / x_scale))
        qx = torch.clamp(torch.round(x / x_scale) + zero_point, 0, 255).to(torch.uint8)
        return torch.ops.onednn.qlinear_pointwise(qx, x_scale, zero_point, packed, scale, zeros, bias, 1.0, 0,
                                                  torch.float32, "none", [], "")
    return run


def _intmm(x, weight, bias) -> Callable:
    import torch
    qweight, scale = _quantized(weight)
    qweight_t = qweight.t()

    def run():
        x_scale = x.abs().amax(dim=1, keepdim=True).clamp(min=1e-8) / 127.0
        qx = torch.round(x / x_scale).to(torch.int8)
        return torch._int_mm(qx, qweight_t) * x_scale * scale + bias
    return run


def _torchao(x, weight, bias) -> Callable:
    import torch
    from torchao.quantization import Int8DynamicActivationInt8WeightConfig, quantize_
    linear = torch.nn.Linear(weight.shape[1], weight.shape[0])
    with torch.no_grad():
        linear.weight.copy_(weight)
        linear.bias.copy_(bias)
    quantize_(linear, Int8DynamicActivationInt8WeightConfig())
    return lambda: linear(x)


def build(name: str, x, weight, bias) -> Callable:
    """A no-argument callable computing x W^T + b with candidate `name` (weights prepared outside the timing)."""
    import torch
    import torch.nn.functional as F
    if name == "float32":
        return lambda: F.linear(x, weight, bias)
    if name in ("float32-onednn", "float32-panels"):
        from seq2seq_engine.models.packed_linear import PackedLinear
        layer = PackedLinear(weight, bias, keep_weight=False, panels=name == "float32-panels")
        return lambda: layer(x)
    if name == "bfloat16":
        xb, wb, bb = x.bfloat16(), weight.bfloat16(), bias.bfloat16()
        return lambda: F.linear(xb, wb, bb)
    if name in ("int8-panels", "int8-fbgemm", "int8-fbgemm-pt"):
        from seq2seq_engine.models.int8 import Int8Linear
        layer = Int8Linear(weight, bias, per_row=name != "int8-fbgemm-pt", native=name == "int8-panels")
        return lambda: layer(x)
    if name == "w8-bf16":
        qweight, scale = _quantized(weight)
        xb, sb, bb = x.bfloat16(), scale.bfloat16(), bias.bfloat16()
        return lambda: torch._weight_int8pack_mm(xb, qweight, sb) + bb
    return {"int8-onednn": _onednn, "int8-intmm": _intmm, "torchao": _torchao}[name](x, weight, bias)


# ------------------------------------------------------------------------------------------- timing
def evict_bytes() -> int:
    """How much --cold reads before each timed call: three times this CPU's last-level cache, at least
    MIN_EVICT_BYTES."""
    from machine import last_level_cache_bytes
    return max(MIN_EVICT_BYTES, 3 * last_level_cache_bytes())


def time_shape(rows: int, k: int, n: int, names: List[str], rounds: int, calls: int,
               cold: bool = False) -> Dict[str, Tuple[float, float]]:
    """{candidate: (fastest call in ms, relative error vs float32)} on one shape, candidates interleaved; `cold`
    reads evict_bytes() before each timed call."""
    import torch
    evict = torch.ones(evict_bytes() // 4) if cold else None
    generator = torch.Generator().manual_seed(rows * 7919 + k * 31 + n)
    x = torch.randn(rows, k, generator=generator)
    weight = torch.randn(n, k, generator=generator) / k ** 0.5
    bias = torch.randn(n, generator=generator) * 0.1
    with torch.inference_mode():
        reference = torch.nn.functional.linear(x, weight, bias)
        runs, errors = {}, {}
        for name in names:
            runs[name] = build(name, x, weight, bias)
            errors[name] = ((runs[name]().float() - reference).abs().max() / reference.abs().max()).item()
        best = {name: float("inf") for name in names}
        for _ in range(rounds):
            for name in names:
                for _ in range(calls):
                    if evict is not None:
                        evict.sum()
                    start = time.perf_counter()
                    runs[name]()
                    best[name] = min(best[name], time.perf_counter() - start)
    return {name: (best[name] * 1e3, errors[name]) for name in names}


def header(args: argparse.Namespace) -> None:
    import torch
    from machine import cpu_description

    from seq2seq_engine.models.int8 import activations_need_reduced_range
    isa = {k: os.environ[k] for k in AVX2_ENV if k in os.environ}
    print(f"argv: {' '.join(sys.argv)}")
    print(f"date {datetime.datetime.now().isoformat(timespec='minutes')}, torch {torch.__version__}, threads "
          f"{torch.get_num_threads()}, cpu capability {torch.backends.cpu.get_cpu_capability()}, ISA env {isa or '-'}, "
          f"int8 activations reduced to 7 bits: {activations_need_reduced_range()}, load average "
          f"{' '.join(f'{v:.2f}' for v in os.getloadavg())}, {cpu_description()}", flush=True)


def report(results: List[Tuple[Tuple[str, int, int, int], Dict[str, Tuple[float, float]]]], names: List[str]) -> None:
    """Milliseconds per call, then each candidate's speed-up over float32 (and int8-fbgemm's over bfloat16)."""
    ratios = [(name, "float32") for name in names if name != "float32" and "float32" in names]
    if "int8-fbgemm" in names and "bfloat16" in names:
        ratios.append(("int8-fbgemm", "bfloat16"))
    print("| shape | rows | K -> N | " + " | ".join(f"{name} ms" for name in names) + " | "
          + " | ".join(f"{name} vs {base}" for name, base in ratios) + " |")
    print("|" + "---|" * (3 + len(names) + len(ratios)))
    for (label, rows, k, n), cells in results:
        times = [f"{cells[name][0]:.3f}" for name in names]
        speedups = [f"{cells[base][0] / cells[name][0]:.2f}x" for name, base in ratios]
        print(f"| {label} | {rows} | {k} -> {n} | " + " | ".join(times + speedups) + " |")
    print("largest relative error vs float32 over the shapes: "
          + ", ".join(f"{name} {max(cells[name][1] for _, cells in results):.4f}" for name in names), flush=True)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.avx2:
        child = [a for a in (argv if argv is not None else sys.argv[1:]) if a != "--avx2"]
        return subprocess.run([sys.executable, os.path.abspath(__file__), *child],
                              env={**os.environ, **AVX2_ENV}).returncode
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import seq2seq_engine  # noqa: F401 - first: its OpenMP defaults must precede torch

    # isort: split
    import torch
    torch.set_num_threads(args.threads)
    names = [name for name in args.candidates.split(",") if name]
    unknown = [name for name in names if name not in CANDIDATES]
    if unknown:
        raise SystemExit(f"unknown candidate {unknown[0]!r}: choose from {', '.join(CANDIDATES)}")
    if "torchao" in names and importlib.util.find_spec("torchao") is None:
        print("torchao is not installed: skipped")
        names.remove("torchao")
    from seq2seq_engine.kernels.native_linear import panel_linear_available
    if "float32-panels" in names and not panel_linear_available():
        print("the panel kernel is not available here (no AVX-512): float32-panels skipped")
        names.remove("float32-panels")
    from seq2seq_engine.kernels.native_int8 import int8_linear_available
    if "int8-panels" in names and not int8_linear_available():
        print("the native int8 kernel is not available here (no AVX-512 VNNI): int8-panels skipped")
        names.remove("int8-panels")
    header(args)
    results = []
    for model in args.models.split(","):
        for shape in SHAPES[model]:
            results.append((shape, time_shape(*shape[1:], names, args.rounds, args.calls, args.cold)))
            print(f"  {model} {shape[0]} {shape[1]}x{shape[2]}->{shape[3]}: "
                  + ", ".join(f"{name} {ms:.3f} ms" for name, (ms, _) in results[-1][1].items()), flush=True)
    report(results, names)
    return 0


if __name__ == "__main__":
    sys.exit(main())
