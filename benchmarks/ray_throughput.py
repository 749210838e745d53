"""Ray scale-out throughput: one job run as a plain single process, then through the Ray Data path
(seq2seq_engine/integrations/) on a local Ray instance with 1 and 2 replicas, on the same inputs and CPUs.

    nice .venv/bin/python -m benchmarks.ray_throughput --workload transcribe --files 48
    nice .venv/bin/python -m benchmarks.ray_throughput --workload generate --prompts 64 --max-tokens 64
    nice .venv/bin/python -m benchmarks.ray_throughput --quick               # smoke run, a few tiny inputs

Workloads: `transcribe` = whisper-tiny.en over `--files` copies of pytest-audioeval's English clips (1-3 s each);
`generate` = smollm2-135m, greedy, `--prompts` chat prompts of `--max-tokens` new tokens. Every wall time is end to
end and includes importing torch and the engine and loading the model: the single process in a spawned child (torch
on `--threads` threads), the Ray
runs from the first row handed to Ray Data to the last row back (actors started, models loaded, batches run), with
`--threads` CPUs split between the replicas. Ray's own start (`ray.init`) is printed apart. The table gives each
run's inputs/s and its wall time relative to the single process: at 1 replica, the overhead of the Ray path.
"""
from __future__ import annotations

import argparse
import glob
import os
import sys
import time
from typing import Any, Dict, List

import seq2seq_engine  # noqa: F401,I001 - first: its OpenMP defaults must precede torch

# isort: split
from benchmarks.lib.common import EngineRun, print_markdown, print_run_header, run_isolated

ENGINE = {"kv_cache_space_gb": 1.0, "swap_space_gb": 0.1}
PROMPTS = ["Explain {} in simple terms.", "Write a short paragraph about {}.", "What are three facts about {}?"]
TOPICS = ["photosynthesis", "black holes", "the water cycle", "volcanoes", "the Roman Empire", "vaccines",
          "plate tectonics", "the printing press"]


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", default="transcribe", choices=["transcribe", "generate"])
    parser.add_argument("--files", type=int, default=48, help="transcribe: audio files (copies of the clips)")
    parser.add_argument("--prompts", type=int, default=64, help="generate: prompts")
    parser.add_argument("--max-tokens", type=int, default=64, help="generate: new tokens per prompt")
    parser.add_argument("--threads", type=int, default=2, help="CPUs of every run (split between replicas)")
    parser.add_argument("--replicas", default="1,2", help="comma list of replica counts for the Ray runs")
    parser.add_argument("--batch-size", type=int, default=0,
                        help="rows per Ray batch (0: the inputs split evenly, two batches per replica)")
    parser.add_argument("--quick", action="store_true", help="smoke run: 4 files or 4 prompts of 8 tokens")
    args = parser.parse_args(argv)
    if args.quick:
        args.files, args.prompts, args.max_tokens = 4, 4, 8
    return args


def job_inputs(args: argparse.Namespace) -> Dict[str, Any]:
    """The model and the rows of the job (the same inputs for every run)."""
    from seq2seq_engine.model_loader.resolver import resolve_model_path

    if args.workload == "transcribe":
        import pytest_audioeval
        folder = os.path.join(list(pytest_audioeval.__path__)[0], "samples", "audio", "en")
        clips = sorted(glob.glob(os.path.join(folder, "*.wav")))
        return {"model": resolve_model_path("whisper-tiny.en"),
                "rows": [{"index": i, "path": clips[i % len(clips)]} for i in range(args.files)]}
    prompts = [PROMPTS[i % len(PROMPTS)].format(TOPICS[i % len(TOPICS)]) for i in range(args.prompts)]
    rows = [{"index": index, "prompt": prompt} for index, prompt in enumerate(prompts)]
    return {"model": resolve_model_path("smollm2-135m"), "rows": rows}


def single_process(workload: str, model: str, rows: List[dict], threads: int, max_tokens: int) -> EngineRun:
    """The plain run in this (child) process: import, load, then every input in one call; the wall includes importing
    torch and the engine and loading the model, as a replica's does."""
    start = time.perf_counter()
    import torch

    from seq2seq_engine.entrypoints.llm import LLM
    from seq2seq_engine.transcription.options import TranscriptionOptions

    torch.set_num_threads(threads)
    llm = LLM(model, **ENGINE)
    loaded = time.perf_counter()
    if workload == "transcribe":
        results = llm.transcribe([row["path"] for row in rows], TranscriptionOptions(use_tqdm=False))
        texts = [result.text for result in results]
    else:
        params = {"temperature": 0.0, "max_tokens": max_tokens}
        texts = [output.outputs[0].text for output in llm.generate([row["prompt"] for row in rows], params,
                                                                   use_tqdm=False)]
    end = time.perf_counter()
    return EngineRun("single", "float32", end - start, texts, walls=[loaded - start, end - loaded])


def ray_run(args: argparse.Namespace, model: str, rows: List[dict], replicas: int) -> EngineRun:
    """The job through Ray Data with `replicas` actors of threads / replicas CPUs each; wall: rows in to rows out."""
    from seq2seq_engine.integrations.ray_data import GenerateBatch, ReplicaConfig, TranscribeBatch
    from seq2seq_engine.integrations.ray_jobs import RayJob, run_rows
    from seq2seq_engine.transcription.options import TranscriptionOptions

    batch_size = args.batch_size or max(1, -(-len(rows) // (2 * replicas)))
    job = RayJob(num_replicas=replicas, cpus_per_replica=args.threads / replicas, batch_size=batch_size,
                 progress=False)
    if args.workload == "transcribe":
        batch_class, config = TranscribeBatch, ReplicaConfig(model, ENGINE, transcription=TranscriptionOptions())
    else:
        batch_class = GenerateBatch
        config = ReplicaConfig(model, ENGINE, sampling={"temperature": 0.0, "max_tokens": args.max_tokens})
    start = time.perf_counter()
    out = sorted(run_rows(job, rows, batch_class, config), key=lambda row: row["index"])
    wall = time.perf_counter() - start
    return EngineRun(f"ray x{replicas}", "float32", wall, [row["text"] for row in out], walls=[wall])


def main(argv=None) -> int:
    args = parse_args(argv)
    print_run_header(args.threads)
    inputs = job_inputs(args)
    rows, count = inputs["rows"], len(inputs["rows"])
    print(f"workload {args.workload}: {count} inputs, model {inputs['model']}", flush=True)
    single = run_isolated(single_process, args.workload, inputs["model"], rows, args.threads, args.max_tokens)
    print(f"  single: {single.wall:.2f} s (imports and load {single.walls[0]:.2f} s, run {single.walls[1]:.2f} s)",
          flush=True)

    import ray
    start = time.perf_counter()
    ray.init(num_cpus=args.threads, include_dashboard=False, log_to_driver=False)
    print(f"  ray.init (local instance, {args.threads} CPUs): {time.perf_counter() - start:.2f} s", flush=True)
    runs = [single]
    for replicas in [int(n) for n in args.replicas.split(",")]:
        runs.append(ray_run(args, inputs["model"], rows, replicas))
        print(f"  ray x{replicas}: {runs[-1].wall:.2f} s", flush=True)
    ray.shutdown()

    header = ["run", "CPUs each", "wall s", "inputs/s", "wall vs single", "same texts"]
    table = []
    for run in runs:
        replicas = 1 if run is single else int(run.engine.split("x")[1])
        same = sum(a == b for a, b in zip(run.outputs, single.outputs))
        table.append([run.engine, f"{args.threads / replicas:g}", f"{run.wall:.2f}", f"{count / run.wall:.2f}",
                      f"{run.wall / single.wall:.2f}x", f"{same}/{count}"])
    print_markdown(header, table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
