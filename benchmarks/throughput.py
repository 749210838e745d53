"""Offline generation throughput: this engine vs HF transformers generate() vs CTranslate2, same weights, same
inputs, same output lengths, one command (each engine in its own child process; see lib/common.py).

    .venv/bin/python -m benchmarks.throughput                          # bart and smollm2, greedy
    .venv/bin/python -m benchmarks.throughput --workload bart --beam 4
    .venv/bin/python -m benchmarks.throughput --workload smollm2 --engines ours,hf --rounds 3   # interleaved
    .venv/bin/python -m benchmarks.throughput --quick                  # smoke run, small sizes
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from typing import List, Tuple

import seq2seq_engine  # noqa: F401,I001 - first: its OpenMP defaults must precede torch

# isort: split
from benchmarks.lib.common import EngineRun, EngineSpec, ct2_installed, print_run_header, run_rounds, speed_table
from benchmarks.lib.gen_engines import GenJob, run_ct2, run_hf, run_ours
from benchmarks.lib.gen_workloads import FULL, build_job, parse_args
from benchmarks.lib.text_models import convert_ct2


# ---------------------------------------------------------------------------------------------- running
def run_workload(name: str, args: argparse.Namespace, tmp: str) -> Tuple[GenJob, List[EngineRun], List[str]]:
    job = build_job(name, args, os.path.join(tmp, name))
    engines = args.engines.split(",")
    specs: List[EngineSpec] = []
    for dtype in args.ours_dtypes.split(",") if "ours" in engines else []:
        specs.append(EngineSpec(f"ours {dtype}", run_ours, (job, dtype)))
    if "hf" in engines:
        specs.append(EngineSpec("hf float32", run_hf, (job,)))
    if "ct2" in engines and not ct2_installed():
        print("  ct2: ctranslate2 is not installed, skipped", flush=True)
    elif "ct2" in engines:
        job.ct2_dir = convert_ct2(job.model_dir, os.path.join(tmp, name))
        for compute_type in args.ct2_dtypes.split(","):
            specs.append(EngineSpec(f"ct2 {compute_type}", run_ct2, (job, compute_type)))
    failures: List[str] = []
    return job, run_rounds(specs, args.rounds, failures), failures


def print_report(name: str, job: GenJob, runs: List[EngineRun], failures: List[str]) -> None:
    mode = f"beam {job.beam}" if job.beam > 1 else "greedy"
    print(f"\n### {name} ({mode}): {len(job.prompts)} requests, {sum(map(len, job.prompts))} prompt tokens "
          f"(lengths {min(map(len, job.prompts))}-{max(map(len, job.prompts))}), {sum(job.lengths)} new tokens "
          f"forced (per request {min(job.lengths)}-{max(job.lengths)})")
    speed_table(runs, ["gen tokens"], lambda r: [str(sum(map(len, r.outputs)))], "tok/s",
                lambda r: sum(map(len, r.outputs)) / r.wall)
    for run in runs:
        wrong = sum(len(o) != n for o, n in zip(run.outputs, job.lengths))
        if wrong:
            print(f"WARNING: {run.label}: {wrong} of {len(job.lengths)} requests did not generate their target "
                  f"number of tokens")
    distinct = ", ".join(f"{r.label} {sum(len(set(o)) for o in r.outputs) / max(len(r.outputs), 1):.1f}"
                         for r in runs)
    print(f"mean distinct token ids per output (low: repetitive outputs, weak agreement evidence): {distinct}")
    if all(len(o) == n for run in runs for o, n in zip(run.outputs, job.lengths)):
        print("generated token counts: every engine produced exactly the target length for every request")
    for failure in failures:
        print(f"FAILED: {failure}")
    sys.stdout.flush()


def main(argv=None) -> int:
    args = parse_args(argv, __doc__)
    print_run_header(args.threads)
    reports = []
    with tempfile.TemporaryDirectory(prefix="s2s_bench_") as tmp:
        for name in args.workload.split(","):
            if name not in FULL:
                raise SystemExit(f"unknown workload {name!r}: choose from {', '.join(FULL)}")
            print(f"[{name}]", flush=True)
            reports.append((name, *run_workload(name, args, tmp)))
    for report in reports:
        print_report(*report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
