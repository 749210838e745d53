"""Linear kernels vs libraries: per shape (float32, bfloat16, int8), or a workload's float32 matmuls alone vs HF.

    .venv/bin/python -m benchmarks.linear_kernels                     # whisper-base shapes, 5 interleaved rounds
    .venv/bin/python -m benchmarks.linear_kernels --models whisper,bart,smollm2 --rounds 9
    .venv/bin/python -m benchmarks.linear_kernels --models marian,t5 --candidates float32,float32-onednn,float32-panels
    .venv/bin/python -m benchmarks.linear_kernels --models marian,t5 --cold --candidates float32-onednn,float32-panels
    .venv/bin/python -m benchmarks.linear_kernels --models marian,t5 --cold --candidates int8-panels,int8-fbgemm
    .venv/bin/python -m benchmarks.linear_kernels --avx2              # again with oneDNN, MKL, fbgemm and ATen on AVX2
    .venv/bin/python -m benchmarks.linear_kernels --quick             # smoke run: two small shapes, one round
    .venv/bin/python -m benchmarks.linear_kernels --mode floor        # SmolLM2-135M, 64 chat prompts, 128 new tokens
    .venv/bin/python -m benchmarks.linear_kernels --mode floor --rounds 3     # every engine 3 times, interleaved
    .venv/bin/python -m benchmarks.linear_kernels --mode floor --quick        # smoke run: 8 prompts, 16 new tokens
    .venv/bin/python -m benchmarks.linear_kernels --mode builds --cold        # AVX2 builds vs AVX-512, 1 thread
    .venv/bin/python -m benchmarks.linear_kernels --mode builds --quick       # smoke run: one small shape, 3 calls

--mode shapes (the default): one table, a row per shape of `--models`, a column per candidate (y = x W^T + b,
float32 x of `rows` x K, W of N x K):
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

--mode floor: how fast could an engine on this engine's float32 matmuls run workload (c) (throughput.py smollm2)?
`floor` replays only the weight matmuls this engine performs for it through the loaded model's own packed float32
linears (F.linear with SEQ2SEQ_ENGINE_PACKED_LINEAR=0): its fused q/k/v and gate/up shapes, the same prompt packing
into steps and rows per decode step, the logits projection on one row per request and step, random activations and
nothing between them (no attention, norms, sampler or Python bookkeeping). `floor-kv` adds, per decode step, one
read of every cached K/V byte the step's attention must read: the DRAM traffic no decode attention can avoid. The
candidates (default floor,floor-kv,hf,ours) each run in their own child process (lib/common.py), `--rounds` times
interleaved. HF wall / floor wall is the largest speed-up over HF that matmuls at this float32 rate allow;
ours - floor is the time this engine spends outside the weight matmuls. Decoder-only models only.

--mode builds: the native kernels' AVX2 and AVX-VNNI builds against their AVX-512 build and torch capped at AVX2,
on decode (1, 8, 32 rows) and prefill (512 rows) shapes. Every candidate runs in its own child process, since both
the kernels' build target (SEQ2SEQ_ENGINE_NATIVE_MARCH, read once per process) and torch's instruction-set caps
(read when torch loads) are per process; --cold reads 96 MiB before every timed call:
  panels-avx512  the float32 panel kernel (kernels/native_linear.py) built for this CPU (-march=native)
  panels-avx2    the same kernel built with -march=x86-64-v3: its AVX2 + FMA code path
  bf16w-avx512   the panel kernel on bfloat16 weight panels (to_panels(weight, dtype=torch.bfloat16)), widened to
                 float32 as loaded: half the weight bytes; built for this CPU
  bf16w-avx2     the same built with -march=x86-64-v3
  F.linear-avx2  torch F.linear with ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2
  onednn-avx2    oneDNN's linear on a weight reordered once (the engine's other float32 packing), same caps
  int8-avx512    the int8 panel kernel (kernels/native_int8.py) built for this CPU (AVX-512 VNNI where it has it)
  int8-avxvnni   built with -march=alderlake: AVX2 + AVX-VNNI (only where this CPU has avx_vnni)
  int8-avx2      built with -march=x86-64-v3: AVX2, exact vpmaddubsw products
  fbgemm-avx2    torch.ops.quantized.linear_dynamic (per-channel int8 weight, 7-bit activations as AVX2 needs) with
                 FBGEMM_ENABLE_INSTRUCTIONS=AVX2
A cell is the fastest of --calls calls in microseconds. On an AVX-512 CPU the AVX2 columns are AVX2 builds running
on it, not an AVX2 CPU.
"""
from __future__ import annotations

import argparse
import datetime
import importlib.util
import os
import subprocess
import sys
import time
from typing import Dict, List, Tuple

from benchmarks.lib.launch import ROOT, script_argv, script_command
from benchmarks.lib.linear_builds import BUILD_CANDIDATES
from benchmarks.lib.linear_candidates import CANDIDATES, build

FLOOR_ENGINES = ("floor", "floor-kv", "hf", "ours")

AVX2_ENV = {"ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "FBGEMM_ENABLE_INSTRUCTIONS": "AVX2",
            "ATEN_CPU_CAPABILITY": "avx2"}
# mode: the defaults of the options it reads; what --quick sets
DEFAULTS = {"shapes": dict(candidates=",".join(CANDIDATES), rounds=5, calls=3, threads=2),
            "floor": dict(candidates=",".join(FLOOR_ENGINES), rounds=1, calls=0, threads=2),
            "builds": dict(candidates=",".join(BUILD_CANDIDATES), rounds=0, calls=20, threads=1)}
QUICK = {"shapes": dict(models="quick", rounds=1, calls=1), "floor": {}, "builds": dict(calls=3)}
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
    parser.add_argument("--mode", choices=sorted(DEFAULTS), default="shapes")
    parser.add_argument("--candidates", "--engines", dest="candidates", default=None,
                        help="comma list (see above); default: every one of the mode's")
    parser.add_argument("--threads", type=int, default=None, help="default: 1 with --mode builds, else 2")
    parser.add_argument("--cold", action="store_true", help="shapes, builds: evict the caches before every timed "
                        "call (see above)")
    parser.add_argument("--calls", type=int, default=None, help="shapes: timed calls per candidate and round "
                        "(default 3); builds: timed calls per shape (default 20)")
    parser.add_argument("--avx2", action="store_true", help="re-run in a child with " +
                        " ".join(f"{k}={v}" for k, v in AVX2_ENV.items()) + " (a CPU without AVX-512/BF16/VNNI)")
    parser.add_argument("--quick", action="store_true", help="smoke run: shapes two small shapes, one round, one "
                        "call; floor 8 prompts, 16 new tokens; builds one small shape, 3 calls")
    parser.add_argument("--rounds", type=int, default=None, help="shapes, floor: interleaved rounds, each timing "
                        "every candidate (default: shapes 5, floor 1: a fresh child process per engine and round)")
    parser.add_argument("--models", default="whisper", help=f"shapes: comma list of {', '.join(SHAPES)}")
    parser.add_argument("--repeat", type=int, default=1, help="floor: timed runs per engine; the fastest counts")
    parser.add_argument("--worker", help=argparse.SUPPRESS)  # builds: the child timing one candidate
    args = parser.parse_args(argv)
    for name, value in DEFAULTS[args.mode].items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.quick:
        vars(args).update(QUICK[args.mode])
    return args


# ------------------------------------------------------------------------------------------- timing
def evict_bytes() -> int:
    """How much --cold reads before each timed call: three times this CPU's last-level cache, at least
    MIN_EVICT_BYTES."""
    from benchmarks.lib.machine import last_level_cache_bytes
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

    from benchmarks.lib.machine import cpu_description
    from seq2seq_engine.models.int8 import activations_need_reduced_range
    isa = {k: os.environ[k] for k in AVX2_ENV if k in os.environ}
    print(f"argv: {' '.join(script_argv())}")
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


def run_shapes(args: argparse.Namespace) -> int:
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


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.avx2:  # the caps act when the libraries load: a child process that has not imported torch yet
        child = [a for a in (argv if argv is not None else sys.argv[1:]) if a != "--avx2"]
        return subprocess.run(script_command("linear_kernels", *child), cwd=ROOT,
                              env={**os.environ, **AVX2_ENV}).returncode
    if args.mode == "builds":
        from benchmarks.lib.linear_builds import run_builds, worker
        return worker(args.worker, args.calls, args.cold, args.threads, args.quick) if args.worker else run_builds(args)
    import seq2seq_engine  # noqa: F401 - first: its OpenMP defaults must precede torch

    # isort: split
    import torch
    torch.set_num_threads(args.threads)
    if args.mode == "floor":
        from benchmarks.lib.floor_replay import run_floor_mode
        return run_floor_mode(args)
    return run_shapes(args)


if __name__ == "__main__":
    sys.exit(main())
