"""Shared benchmark plumbing: one engine per child process (timing, RSS), token agreement and the results table.

Peak memory: every engine run happens in its own child process (`multiprocessing`, spawn), which imports the
libraries, loads the model, warms up and runs the timed workload, then reports `ru_maxrss` of itself. So
"peak RSS" is what that engine needs end to end (interpreter + torch/transformers imports + weights + caches +
loading transients + run), not polluted by the models of the other engines, and the engines cannot share warm
state. "load RSS" is the child's resident set right after loading and warming up, before the timed run; "run peak"
is the highest resident set a background thread saw (polling /proc every 5 ms) during the timed runs.
"""
from __future__ import annotations

import dataclasses
import datetime
import importlib.util
import multiprocessing
import os
import platform
import resource
import sys
import threading
import time
import traceback
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from benchmarks.lib.launch import script_argv
from benchmarks.lib.machine import cpu_description

OURS = "ours"  # the engine label of this engine's rows; every other label is a peer


@dataclasses.dataclass
class EngineRun:
    engine: str                 # "ours", "hf", "ct2", "hf-longform"
    dtype: str
    wall: float                 # seconds of the timed region (best of the repeats)
    outputs: List[Any]          # per request: token ids (generation) or text (transcription)
    load_rss_mib: float = 0.0
    run_peak_rss_mib: float = 0.0
    peak_rss_mib: float = 0.0
    walls: List[float] = dataclasses.field(default_factory=list)  # every timed repeat

    @property
    def label(self) -> str:
        return f"{self.engine}-{self.dtype}"


def rss_mib() -> float:
    """This process's resident set size now, in MiB (Linux /proc)."""
    with open("/proc/self/statm") as statm:
        pages = int(statm.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def peak_rss_mib() -> float:
    """This process's peak resident set size so far (ru_maxrss is in KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class RssSampler:
    """Highest resident set size seen while the `with` block runs (a daemon thread polling every `interval` s)."""

    def __init__(self, interval: float = 0.005) -> None:
        self.interval = interval
        self.peak = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        while True:
            self.peak = max(self.peak, rss_mib())
            if self._stop.wait(self.interval):
                return

    def __enter__(self) -> "RssSampler":
        self.peak = rss_mib()
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_mib())


def timed_run(engine: str, dtype: str, repeat: int, run_once: Callable[[], List[Any]]) -> EngineRun:
    """Run `run_once` `repeat` times (after the caller's load and warm-up): the fastest wall time and its outputs,
    every wall time, the RSS before and the peak RSS during the runs."""
    load_rss = rss_mib()
    best, outputs, walls = float("inf"), [], []
    with RssSampler() as sampler:
        for _ in range(max(repeat, 1)):
            start = time.perf_counter()
            result = run_once()
            walls.append(time.perf_counter() - start)
            if walls[-1] < best:
                best, outputs = walls[-1], result
    return EngineRun(engine, dtype, best, outputs, load_rss, sampler.peak, walls=walls)


def _child(conn: Any, target: Callable[..., EngineRun], args: tuple) -> None:
    try:
        run = target(*args)
        run.peak_rss_mib = max(peak_rss_mib(), run.run_peak_rss_mib)  # both read RSS; they can differ by ~1 MiB
        conn.send(("ok", run))
    except BaseException as error:  # noqa: BLE001 - handed to the parent, which reports it
        conn.send(("error", f"{type(error).__name__}: {error}\n{traceback.format_exc()}"))
    finally:
        conn.close()


def run_isolated(target: Callable[..., EngineRun], *args: Any) -> EngineRun:
    """Run `target(*args)` (a module-level function returning an EngineRun) in a fresh spawned child process and
    return its EngineRun with the child's peak RSS filled in; the child's exception becomes a RuntimeError."""
    context = multiprocessing.get_context("spawn")
    receiver, sender = context.Pipe(duplex=False)
    process = context.Process(target=_child, args=(sender, target, args))
    process.start()
    sender.close()
    try:
        status, payload = receiver.recv()
    except EOFError:
        status, payload = "error", "the child process died without a result (killed, e.g. out of memory?)"
    process.join()
    if status != "ok":
        raise RuntimeError(payload)
    return payload


def try_isolated(failures: List[str], label: str, target: Callable[..., EngineRun], *args: Any
                 ) -> Optional[EngineRun]:
    """run_isolated, but an engine that fails is reported (and listed in `failures`) instead of ending the run."""
    print(f"  running {label} ...", flush=True)
    try:
        run = run_isolated(target, *args)
    except Exception as error:  # noqa: BLE001 - e.g. a dtype an engine refuses: report it, go on with the others
        message = str(error).strip().splitlines()[0] if isinstance(error, RuntimeError) else f"{error!r}"
        failures.append(f"{label}: {message}")
        print(f"  {label}: failed: {error}", flush=True)
        return None
    print(f"  {label}: {run.wall:.2f} s (runs: {', '.join(f'{w:.2f}' for w in run.walls)}), "
          f"RSS after load {run.load_rss_mib:.0f} MiB, run peak {run.run_peak_rss_mib:.0f} MiB, process peak "
          f"{run.peak_rss_mib:.0f} MiB", flush=True)
    return run


def add_timing_args(parser: Any) -> None:
    """--repeat and --rounds, the same in every script that compares engines."""
    parser.add_argument("--repeat", type=int, default=1, help="timed runs per engine; the fastest is reported")
    parser.add_argument("--rounds", type=int, default=1,
                        help="run every engine this many times, interleaved (a fresh process each); the fastest counts")


@dataclasses.dataclass
class EngineSpec:
    label: str                              # as printed: "ours float32", "hf float32", "ct2 int8"
    target: Callable[..., EngineRun]        # a module-level function run in a child process
    args: tuple


def merge_runs(previous: Optional[EngineRun], run: EngineRun) -> EngineRun:
    """One engine's runs from two rounds as one: the faster run's wall time and outputs, every wall time, the
    higher memory peaks."""
    if previous is None:
        return run
    faster = run if run.wall < previous.wall else previous
    return dataclasses.replace(faster, walls=previous.walls + run.walls,
                               run_peak_rss_mib=max(previous.run_peak_rss_mib, run.run_peak_rss_mib),
                               peak_rss_mib=max(previous.peak_rss_mib, run.peak_rss_mib))


def run_rounds(specs: List[EngineSpec], rounds: int, failures: List[str]) -> List[EngineRun]:
    """Every engine once per round, the rounds one after the other (A, B, C, A, B, C, ...): a slow phase of a shared
    machine then falls on every engine instead of on whichever ran during it. Per engine, the fastest run over
    all rounds is reported (every wall time kept); an engine that fails is not run again."""
    merged: Dict[str, EngineRun] = {}
    failed = set()
    for round_index in range(max(rounds, 1)):
        for spec in specs:
            if spec.label in failed:
                continue
            suffix = f" (round {round_index + 1}/{rounds})" if rounds > 1 else ""
            run = try_isolated(failures, spec.label + suffix, spec.target, *spec.args)
            if run is None:
                failed.add(spec.label)
            else:
                merged[spec.label] = merge_runs(merged.get(spec.label), run)
    return [merged[spec.label] for spec in specs if spec.label in merged]


def ct2_installed() -> bool:
    return importlib.util.find_spec("ctranslate2") is not None


def environment_line(threads: int) -> str:
    """Versions, threads, the load average, the date and the CPU, to print with every table (timings depend on
    them)."""
    import torch
    import transformers
    parts = [f"python {platform.python_version()}", f"torch {torch.__version__}",
             f"transformers {transformers.__version__}"]
    if ct2_installed():
        import ctranslate2
        parts.append(f"ctranslate2 {ctranslate2.__version__}")
    load = os.getloadavg()
    parts += [f"threads {threads}", f"cpus {os.cpu_count()}", f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}",
              f"date {datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}", cpu_description()]
    return ", ".join(parts)


def print_run_header(threads: int) -> None:
    print(f"argv: {' '.join(script_argv())}")
    print(environment_line(threads), flush=True)


# ---------------------------------------------------------------------------------------------- agreement
def common_prefix(a: Sequence[Any], b: Sequence[Any]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def agreement(reference: List[Sequence[Any]], other: List[Sequence[Any]]) -> Tuple[float, float]:
    """(fraction of requests identical, mean common prefix as a fraction of the longer output)."""
    if not reference:
        return 0.0, 0.0
    same = sum(list(a) == list(b) for a, b in zip(reference, other))
    prefix = [common_prefix(a, b) / max(len(a), len(b), 1) for a, b in zip(reference, other)]
    return same / len(reference), sum(prefix) / len(prefix)


def reference_run(runs: List[EngineRun]) -> Optional[EngineRun]:
    """Ours at float32: every engine's agreement is measured against it."""
    return next((r for r in runs if r.engine == OURS and r.dtype == "float32"), None)


# ---------------------------------------------------------------------------------------------- table
def ratio_columns(runs: List[EngineRun]) -> List[str]:
    return [f"vs {r.label}" for r in runs if r.engine != OURS]


def ratio_cells(run: EngineRun, runs: List[EngineRun]) -> List[str]:
    """On our rows: peer wall / our wall (> 1: we are faster); blank on peer rows."""
    return [f"{peer.wall / run.wall:.2f}x" if run.engine == OURS else "" for peer in runs if peer.engine != OURS]


def agreement_cells(run: EngineRun, reference: Optional[EngineRun]) -> List[str]:
    if reference is None:
        return ["", ""]
    same, prefix = agreement(reference.outputs, run.outputs)
    return [f"{same:.0%}", f"{prefix:.1%}"]


def print_markdown(header: List[str], rows: List[List[str]]) -> None:
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in rows:
        print("| " + " | ".join(row) + " |")
    sys.stdout.flush()


def speed_table(runs: List[EngineRun], first_columns: List[str], first_cells: Callable[[EngineRun], List[str]],
                speed_column: str, speed: Callable[[EngineRun], float]) -> None:
    """engine, dtype, <first columns>, wall s, <speed>, load/peak RSS, ratios vs each peer, agreement with ours."""
    reference = reference_run(runs)
    header = (["engine", "dtype"] + first_columns + ["wall s", speed_column, "RSS after load MiB",
                                                     "run peak RSS MiB", "process peak RSS MiB"]
              + ratio_columns(runs) + ["same as ours-float32", "common prefix"])
    rows = []
    for run in runs:
        rows.append([run.engine, run.dtype] + first_cells(run)
                    + [f"{run.wall:.2f}", f"{speed(run):.2f}", f"{run.load_rss_mib:.0f}",
                       f"{run.run_peak_rss_mib:.0f}", f"{run.peak_rss_mib:.0f}"]
                    + ratio_cells(run, runs) + agreement_cells(run, reference))
    print_markdown(header, rows)
