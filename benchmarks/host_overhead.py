"""Host (Python) time per engine step at large batch: tiny random Whisper and BART on the CPU, where the model's own
compute is small, so what is left of each step is the scheduler, input preparation and output processing."""
import argparse
import json
import sys
import tempfile
import time
from typing import Callable, Dict, List

from benchmarks.lib import gpu_workloads as gw
from benchmarks.lib.machine import cpu_description

# The host's three parts of a step: Scheduler.schedule, ModelRunner.prepare_inputs and OutputProcessor.process.
PHASES = ("schedule", "inputs", "outputs")


class StepTimer:
    """Wraps the engine's step, the model's compute (forward, logits, sampler) and the host's three phases
    (PHASES) with counters: wall seconds, and the calling thread's CPU seconds for the compute."""

    def __init__(self, llm) -> None:
        engine = llm.llm_engine
        runner = engine.model_runner
        self.reset()
        self._wrap(engine, "step", counted=True)
        self._wrap(runner.model, "forward", "compute")
        self._wrap(runner.model, "compute_logits", "compute")
        self._wrap(runner.sampler, "forward", "compute")
        self._wrap(engine.scheduler, "schedule", "schedule")
        self._wrap(runner, "prepare_inputs", "inputs")
        self._wrap(engine.output_processor, "process", "outputs")

    def _wrap(self, owner, name: str, counter: str = "", counted: bool = False) -> None:
        inner: Callable = getattr(owner, name)

        def timed(*args, **kwargs):
            if counted:
                self.steps += 1
                return inner(*args, **kwargs)
            start, start_cpu = time.perf_counter(), time.thread_time()
            try:
                return inner(*args, **kwargs)
            finally:
                self.seconds[counter] += time.perf_counter() - start
                if counter == "compute":   # what other processes' load leaves out of the host's share
                    self.compute_cpu_s += time.thread_time() - start_cpu

        setattr(owner, name, timed)

    @property
    def compute_s(self) -> float:
        return self.seconds["compute"]

    def reset(self) -> None:
        self.steps, self.compute_cpu_s = 0, 0.0
        self.seconds = {name: 0.0 for name in ("compute",) + PHASES}


def measure(name: str, llm, run: Callable[[], List[List[int]]], rounds: int) -> Dict[str, float]:
    """Of `rounds` runs (after a warm-up), the one with the least host CPU time: wall, model compute and host
    milliseconds per step (host wall: wall minus compute; host CPU: the engine thread's CPU time outside the model,
    which a loaded machine inflates far less)."""
    timer = StepTimer(llm)
    run()
    best = None
    for _ in range(rounds):
        timer.reset()
        start, start_cpu = time.perf_counter(), time.thread_time()
        tokens = run()
        wall, cpu = time.perf_counter() - start, time.thread_time() - start_cpu
        row = dict(wall_s=wall, steps=timer.steps, compute_ms_per_step=1e3 * timer.compute_s / timer.steps,
                   host_ms_per_step=1e3 * (wall - timer.compute_s) / timer.steps,
                   host_cpu_ms_per_step=1e3 * (cpu - timer.compute_cpu_s) / timer.steps,
                   phases_ms_per_step=[1e3 * timer.seconds[phase] / timer.steps for phase in PHASES],
                   tokens=sum(len(t) for t in tokens))
        print(f"  {name}: wall {wall:.3f} s, {row['steps']} steps, compute {row['compute_ms_per_step']:.2f} ms/step, "
              f"host {row['host_ms_per_step']:.2f} ms/step (CPU {row['host_cpu_ms_per_step']:.2f})", file=sys.stderr)
        if best is None or row["host_cpu_ms_per_step"] < best["host_cpu_ms_per_step"]:
            best = row
    best["token_ids"] = tokens
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--whisper-windows", type=int, default=128)
    parser.add_argument("--whisper-new-tokens", type=int, default=120)
    parser.add_argument("--bart-docs", type=int, default=256)
    parser.add_argument("--bart-new-tokens", type=int, default=64)
    parser.add_argument("--tokens-out", help="write every request's generated token ids to this JSON file")
    cli = parser.parse_args()
    if cli.rounds < 1:
        raise ValueError(f"--rounds must be >= 1, got {cli.rounds}")
    args = gw.tiny_cpu_args(max_batch=max(cli.whisper_windows, cli.bart_docs),
                            whisper_new_tokens=cli.whisper_new_tokens, bart_new_tokens=cli.bart_new_tokens,
                            bart_docs=cli.bart_docs, bart_min_len=32, bart_max_len=96)
    rows = {}
    with tempfile.TemporaryDirectory() as workdir:
        whisper = gw.whisper_setup(args, f"{workdir}/whisper")
        features = gw.whisper_features(args, cli.whisper_windows)
        rows[f"whisper {cli.whisper_windows}x{cli.whisper_new_tokens}"] = measure(
            "whisper", whisper.ours, lambda: gw.whisper_ours(whisper.ours, features, cli.whisper_new_tokens),
            cli.rounds)
        documents = gw.bart_documents(args)
        bart = gw.bart_setup(args, f"{workdir}/bart", documents)
        rows[f"bart {cli.bart_docs}x{cli.bart_new_tokens}"] = measure(
            "bart", bart.ours, lambda: gw.bart_ours(bart.ours, documents, cli.bart_new_tokens), cli.rounds)
    if cli.tokens_out:
        with open(cli.tokens_out, "w") as out:
            json.dump({name: row.pop("token_ids") for name, row in rows.items()}, out)
    date = time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())
    print(f"{cpu_description()}, {date}, the round of least host CPU time of {cli.rounds}\n")
    print("| workload | wall s | steps | model compute ms/step | host ms/step | host CPU ms/step | tokens |")
    print("|---|---|---|---|---|---|---|")
    for name, row in rows.items():
        print(f"| {name} | {row['wall_s']:.3f} | {row['steps']} | {row['compute_ms_per_step']:.2f} | "
              f"{row['host_ms_per_step']:.2f} | {row['host_cpu_ms_per_step']:.2f} | {row['tokens']} |")
    print("\nThe host's share by phase (wall ms/step; the rest of the host time is the step's own bookkeeping):\n")
    print("| workload | " + " | ".join(PHASES) + " |")
    print("|---|" + "---|" * len(PHASES))
    for name, row in rows.items():
        print(f"| {name} | " + " | ".join(f"{ms:.2f}" for ms in row["phases_ms_per_step"]) + " |")


if __name__ == "__main__":
    main()
