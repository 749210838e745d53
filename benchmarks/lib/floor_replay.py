"""The floors of linear_kernels.py --mode floor: a workload's float32 weight matmuls (and K/V reads) alone, timed."""
from __future__ import annotations

import argparse
import sys
import time
from typing import Dict, List, NamedTuple, Optional, Tuple

import seq2seq_engine  # noqa: F401,I001 - first: its OpenMP defaults must precede torch

# isort: split
import torch

from benchmarks.lib import gen_workloads
from benchmarks.lib.common import (EngineRun, EngineSpec, agreement, print_markdown, print_run_header, run_rounds,
                                   timed_run)
from benchmarks.lib.gen_engines import GenJob, run_hf, run_ours
from seq2seq_engine.model_loader.loader import load_model
from seq2seq_engine.models.packed_linear import PackedLinear
from seq2seq_engine.platforms.cpu_memory import cpu_max_batched_tokens


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
        raise ValueError("the floor handles decoder-only models only")
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


def run_floor_mode(args: argparse.Namespace) -> int:
    """linear_kernels.py --mode floor: SmolLM2-135M's chat workload through the floors, HF and this engine."""
    print_run_header(args.threads)
    job_args = gen_workloads.parse_args(["--workload", "smollm2", "--threads", str(args.threads),
                                         "--repeat", str(args.repeat)] + (["--quick"] if args.quick else []))
    job = gen_workloads.build_job("smollm2", job_args, "")
    print(f"smollm2: {len(job.prompts)} prompts, {sum(map(len, job.prompts))} prompt tokens, "
          f"{max(job.lengths)} new tokens each", flush=True)
    targets = {"floor": (run_floor, (job,)), "floor-kv": (run_floor, (job, True)), "hf": (run_hf, (job,)),
               "ours": (run_ours, (job, "float32"))}
    unknown = [name for name in args.candidates.split(",") if name not in targets]
    if unknown:
        raise SystemExit(f"unknown engine {unknown[0]!r}: choose from {', '.join(targets)}")
    specs = [EngineSpec(name, *targets[name]) for name in args.candidates.split(",")]
    failures: List[str] = []
    runs = {run.engine: run for run in run_rounds(specs, args.rounds, failures)}  # engine: floor, floor-kv, hf, ours
    report(runs)
    for failure in failures:
        print(f"FAILED: {failure}")
    return 1 if failures else 0
