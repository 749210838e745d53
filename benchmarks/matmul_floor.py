"""How fast can an engine on this engine's float32 matmuls run workload (c)? Its weight matmuls alone, timed.

    .venv/bin/python benchmarks/matmul_floor.py              # SmolLM2-135M, 64 chat prompts, 128 new tokens
    .venv/bin/python benchmarks/matmul_floor.py --repeat 2   # fastest of two timed runs per engine
    .venv/bin/python benchmarks/matmul_floor.py --rounds 3   # every engine 3 times, interleaved
    .venv/bin/python benchmarks/matmul_floor.py --quick      # smoke run: 8 prompts, 16 new tokens

"floor" replays only the weight matmuls this engine performs for the workload through the loaded model's own
layers, the packed float32 linears (F.linear with SEQ2SEQ_ENGINE_PACKED_LINEAR=0): its fused q/k/v and
gate/up shapes, the same prompt packing into steps and the same rows per decode step, the logits projection on one row
per request and step, with random activations and nothing between them: no attention, norms, sampler or Python
bookkeeping. "floor-kv" adds, per decode step, one read of every cached K/V byte the step's attention must read
(a sum over that much of a float32 pool): the DRAM traffic no decode attention can avoid. Each runs next to HF
`generate` and this engine, in its own child process (common.py). HF wall / floor wall is the largest speed-up
over HF that matmuls at this float32 rate allow; ours - floor is the time this engine spends outside the
weight matmuls. Decoder-only models only: the encoder/decoder workloads have no target the floor is needed for.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Dict, List, NamedTuple, Optional, Tuple

import seq2seq_engine  # noqa: F401,E402,I001 - first: its OpenMP defaults must precede torch

# isort: split
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import throughput  # noqa: E402
import torch  # noqa: E402
from common import (EngineRun, EngineSpec, add_timing_args, agreement, print_markdown, print_run_header,  # noqa: E402
                    run_rounds, timed_run)
from gen_engines import GenJob, run_hf, run_ours  # noqa: E402

from seq2seq_engine.model_loader.loader import load_model  # noqa: E402
from seq2seq_engine.models.packed_linear import PackedLinear  # noqa: E402
from seq2seq_engine.platforms.cpu_memory import cpu_max_batched_tokens  # noqa: E402


class Step(NamedTuple):
    rows: int         # token rows through the decoder layers
    requests: int     # rows through the logits projection (one per request)
    context: int      # cached tokens the step's decode attention reads (0 in prefill steps)


def step_plan(prompts: List[List[int]], lengths: List[int], budget: int) -> List[Step]:
    """The engine's steps for the job when every request is admitted at once: whole prompts packed into prefill
    steps of at most `budget` tokens (each gives its requests their first token), then one decode step per
    further token, over the requests that still want one."""
    plan: List[Step] = []
    rows = requests = 0
    for prompt in prompts:
        if rows and rows + len(prompt) > budget:
            plan.append(Step(rows, requests, 0))
            rows = requests = 0
        rows, requests = rows + len(prompt), requests + 1
    plan.append(Step(rows, requests, 0))
    for generated in range(1, max(lengths)):
        live = [len(p) + generated for p, length in zip(prompts, lengths) if length > generated]
        plan.append(Step(len(live), len(live), sum(live)))
    return plan


def _replay(layers: List[torch.nn.Module], head: torch.nn.Module, plan: List[Step],
            inputs: Dict[Tuple[int, int], torch.Tensor], kv_pool: Optional[torch.Tensor]) -> Tuple[float, float]:
    """(prefill seconds, decode seconds) of the plan's weight matmuls, and of its K/V reads given a pool
    ([tokens, floats per token over all layers])."""
    prefill = decode = 0.0
    with torch.inference_mode():
        for step in plan:
            start = time.perf_counter()
            for layer in layers:
                layer(inputs[step.rows, layer.in_features])
            head(inputs[step.requests, head.in_features])
            if kv_pool is not None and step.context:
                kv_pool[:step.context].sum()
            elapsed = time.perf_counter() - start
            if step.context:
                decode += elapsed
            else:
                prefill += elapsed
    return prefill, decode


def run_floor(job: GenJob, with_kv_reads: bool = False) -> EngineRun:
    """The job's weight matmuls alone (and its decode K/V reads, with_kv_reads), at float32; no tokens."""
    if job.enc_dec:
        raise ValueError("matmul_floor handles decoder-only models only")
    torch.set_num_threads(job.threads)
    model, hf_config = load_model(job.model_dir, torch.float32)
    head = model.lm_head
    layers = [m for m in model.modules() if isinstance(m, (torch.nn.Linear, PackedLinear)) and m is not head]
    plan = step_plan(job.prompts, job.lengths, cpu_max_batched_tokens(hf_config, max(map(len, job.prompts))))
    widths = {layer.in_features for layer in layers} | {head.in_features}
    inputs = {(rows, width): torch.randn(rows, width)
              for rows in {n for step in plan for n in step[:2]} for width in widths}
    num_layers, num_kv_heads, head_dim = model.kv_cache_spec()
    kv_pool = (torch.randn(max(step.context for step in plan), num_layers * 2 * num_kv_heads * head_dim)
               if with_kv_reads else None)
    _replay(layers, head, plan[:2], inputs, kv_pool)  # warm-up: first touch of the weights and inputs
    splits: List[Tuple[float, float]] = []

    def run_once() -> List[List[int]]:
        splits.append(_replay(layers, head, plan, inputs, kv_pool))
        return [[] for _ in job.prompts]

    label = "floor-kv" if with_kv_reads else "floor"
    run = timed_run(label, "float32", job.repeat, run_once)
    prefill, decode = min(splits, key=sum)
    print(f"  {label}: {len(plan)} steps, prefill {prefill:.2f} s, decode {decode:.2f} s "
          f"({decode / max(len(plan) - 1, 1) * 1e3:.1f} ms a decode step)", flush=True)
    return run


def report(runs: Dict[str, EngineRun]) -> None:
    """The wall times, and what they say about the largest speed-up over HF these matmuls allow."""
    rows = [[name, f"{run.wall:.2f}", " / ".join(f"{w:.2f}" for w in run.walls)] for name, run in runs.items()]
    print_markdown(["engine", "wall s (best)", "every timed run"], rows)
    floor, hf, ours = runs.get("floor"), runs.get("hf"), runs.get("ours")
    for name in ("floor", "floor-kv"):
        if name in runs and hf:
            print(f"HF / {name} = {hf.wall / runs[name].wall:.2f}x: the largest speed-up over HF an engine whose "
                  f"float32 weight matmuls run at this engine's rate can reach"
                  + (", reading its K/V cache once a step" if name == "floor-kv" else ""))
    if ours and hf:
        same, prefix = agreement(hf.outputs, ours.outputs)
        print(f"ours vs HF = {hf.wall / ours.wall:.2f}x; same tokens as HF: {same:.0%} of the requests "
              f"(common prefix {prefix:.1%})")
    if ours and floor:
        print(f"ours spends {ours.wall - floor.wall:.2f} s ({1 - floor.wall / ours.wall:.0%} of its wall time) "
              f"outside the weight matmuls")
    sys.stdout.flush()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engines", default="floor,floor-kv,hf,ours", help="comma list of floor, floor-kv, hf, ours")
    parser.add_argument("--threads", type=int, default=2)
    add_timing_args(parser)
    parser.add_argument("--quick", action="store_true", help="smoke run: 8 prompts, 16 new tokens")
    args = parser.parse_args(argv)
    print_run_header(args.threads)
    job_args = throughput.parse_args(["--workload", "smollm2", "--threads", str(args.threads),
                                      "--repeat", str(args.repeat)] + (["--quick"] if args.quick else []))
    job = throughput.build_job("smollm2", job_args, "")
    print(f"smollm2: {len(job.prompts)} prompts, {sum(map(len, job.prompts))} prompt tokens, "
          f"{max(job.lengths)} new tokens each", flush=True)
    targets = {"floor": (run_floor, (job,)), "floor-kv": (run_floor, (job, True)), "hf": (run_hf, (job,)),
               "ours": (run_ours, (job, "float32"))}
    unknown = [name for name in args.engines.split(",") if name not in targets]
    if unknown:
        raise SystemExit(f"unknown engine {unknown[0]!r}: choose from {', '.join(targets)}")
    specs = [EngineSpec(name, *targets[name]) for name in args.engines.split(",")]
    failures: List[str] = []
    runs = {run.engine: run for run in run_rounds(specs, args.rounds, failures)}  # engine: floor, floor-kv, hf, ours
    report(runs)
    for failure in failures:
        print(f"FAILED: {failure}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
