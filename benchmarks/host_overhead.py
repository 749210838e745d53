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


def _round(timer: StepTimer, run: Callable[[], List[List[int]]]) -> Dict[str, float]:
    timer.reset()
    start, start_cpu = time.perf_counter(), time.thread_time()
    tokens = run()
    wall, cpu = time.perf_counter() - start, time.thread_time() - start_cpu
    return dict(wall_s=wall, steps=timer.steps, compute_ms_per_step=1e3 * timer.compute_s / timer.steps,
                host_ms_per_step=1e3 * (wall - timer.compute_s) / timer.steps,
                host_cpu_ms_per_step=1e3 * (cpu - timer.compute_cpu_s) / timer.steps,
                phases_ms_per_step=[1e3 * timer.seconds[phase] / timer.steps for phase in PHASES],
                tokens=sum(len(t) for t in tokens), token_ids=tokens)


def measure(name: str, llms: Dict[str, object], run: Callable[[object], List[List[int]]],
            rounds: int) -> Dict[str, Dict[str, float]]:
    """Per engine of `llms` (label: LLM), of `rounds` runs (after a warm-up; the engines' rounds interleaved) the
    one with the least host CPU time: wall, model compute and host milliseconds per step (host wall: wall minus
    compute; host CPU: the engine thread's CPU time outside the model, which a loaded machine inflates far less)."""
    timers = {label: StepTimer(llm) for label, llm in llms.items()}
    for llm in llms.values():
        run(llm)
    best: Dict[str, Dict[str, float]] = {}
    for _ in range(rounds):
        for label, llm in llms.items():
            row = _round(timers[label], lambda: run(llm))
            print(f"  {name}{label}: wall {row['wall_s']:.3f} s, {row['steps']} steps, compute "
                  f"{row['compute_ms_per_step']:.2f} ms/step, host {row['host_ms_per_step']:.2f} ms/step "
                  f"(CPU {row['host_cpu_ms_per_step']:.2f})", file=sys.stderr)
            if label not in best or row["host_cpu_ms_per_step"] < best[label]["host_cpu_ms_per_step"]:
                best[label] = row
    return {f"{name}{label}": row for label, row in best.items()}


def _engines(setup, model_dir: str, args, compare_async: bool) -> Dict[str, object]:
    """The engine of `setup`, and with `compare_async` a second one on the same weights and pool size scheduling
    asynchronously."""
    llms = {"": setup.ours}
    if compare_async:
        blocks = setup.ours.llm_engine.cache_config.num_gpu_blocks
        llms[", async"] = gw.load_ours(model_dir, argparse.Namespace(**{**vars(args), "async_scheduling": True}),
                                       args.dtype, blocks)
    return llms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--whisper-windows", type=int, default=128)
    parser.add_argument("--whisper-new-tokens", type=int, default=120)
    parser.add_argument("--bart-docs", type=int, default=256)
    parser.add_argument("--bart-new-tokens", type=int, default=64)
    parser.add_argument("--tokens-out", help="write every request's generated token ids to this JSON file")
    parser.add_argument("--async-scheduling", action="store_true", help="the engine scheduling asynchronously")
    parser.add_argument("--compare-async", action="store_true",
                        help="each workload also on an engine scheduling asynchronously, rounds interleaved")
    cli = parser.parse_args()
    if cli.rounds < 1:
        raise ValueError(f"--rounds must be >= 1, got {cli.rounds}")
    args = gw.tiny_cpu_args(max_batch=max(cli.whisper_windows, cli.bart_docs),
                            whisper_new_tokens=cli.whisper_new_tokens, bart_new_tokens=cli.bart_new_tokens,
                            bart_docs=cli.bart_docs, bart_min_len=32, bart_max_len=96,
                            async_scheduling=cli.async_scheduling)
    rows = {}
    with tempfile.TemporaryDirectory() as workdir:
        whisper = gw.whisper_setup(args, f"{workdir}/whisper")
        features = gw.whisper_features(args, cli.whisper_windows)
        rows.update(measure(
            f"whisper {cli.whisper_windows}x{cli.whisper_new_tokens}",
            _engines(whisper, f"{workdir}/whisper", args, cli.compare_async),
            lambda llm: gw.whisper_ours(llm, features, cli.whisper_new_tokens), cli.rounds))
        documents = gw.bart_documents(args)
        bart = gw.bart_setup(args, f"{workdir}/bart", documents)
        rows.update(measure(
            f"bart {cli.bart_docs}x{cli.bart_new_tokens}", _engines(bart, f"{workdir}/bart", args, cli.compare_async),
            lambda llm: gw.bart_ours(llm, documents, cli.bart_new_tokens), cli.rounds))
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
