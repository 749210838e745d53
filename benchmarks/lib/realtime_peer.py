"""The peer of realtime_load.py, run in its own child process: faster-whisper on the same CTranslate2 weights, one
`WhisperModel.transcribe` per VAD turn per stream from a thread pool, each turn submitted when the chunk that ends it
would have arrived at the stream's pace (the turns are the server's, found offline by the same VAD rule)."""
from __future__ import annotations

import concurrent.futures
import dataclasses
import threading
import time
from typing import Any, Dict, List

import seq2seq_engine  # noqa: F401,I001 - first: its OpenMP defaults must precede torch

# isort: split
import numpy as np

from benchmarks.lib.realtime_streams import VadTurn


@dataclasses.dataclass
class PeerJob:
    model_name: str
    hf_dir: str
    turns: List[List[VadTurn]]    # per stream, in order
    stream_counts: List[int]      # run the first N streams, for each N
    chunk_s: float
    pace: float
    threads: int                  # cpu_threads
    workers: int                  # WhisperModel num_workers (calls that run in parallel)
    warmup: np.ndarray
    compute_type: str = "int8"


def _load(job: PeerJob):
    from faster_whisper import WhisperModel

    from benchmarks.lib.long_engines import fw_model_dir
    return WhisperModel(fw_model_dir(job.model_name, job.hf_dir), device="cpu", compute_type=job.compute_type,
                        cpu_threads=job.threads, num_workers=job.workers)


def _transcribe(model: Any, samples: np.ndarray) -> str:
    """Greedy, temperature 0, no timestamps, no conditioning, no VAD of its own: the decode the server runs."""
    segments, _ = model.transcribe(samples, language="en", beam_size=1, temperature=0.0,
                                   condition_on_previous_text=False, without_timestamps=True, vad_filter=False)
    return " ".join(segment.text.strip() for segment in segments)


def _run(model: Any, job: PeerJob, count: int) -> Dict[str, Any]:
    """The first `count` streams at once; per stream its items (as score_stream takes them), and the CPU time."""
    releases = sorted(((turn.chunk + 1) * job.chunk_s / job.pace, s, i)
                      for s in range(count) for i, turn in enumerate(job.turns[s]))
    items = [[{"start": t.start, "end": t.end, "first": None, "done": None, "text": ""} for t in job.turns[s]]
             for s in range(count)]
    lock = threading.Lock()
    cpu0, wall0 = time.process_time(), time.perf_counter()
    t0 = time.perf_counter() + 0.2

    def work(stream: int, index: int) -> None:
        text = _transcribe(model, job.turns[stream][index].samples)
        at = time.perf_counter() - t0
        with lock:
            items[stream][index].update(first=at, done=at, text=text)

    with concurrent.futures.ThreadPoolExecutor(max(count, 1)) as pool:
        futures = []
        for release, stream, index in releases:
            delay = t0 + release - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            futures.append(pool.submit(work, stream, index))
        for future in futures:
            future.result()
    return {"items": items, "cpu": time.process_time() - cpu0, "wall": time.perf_counter() - wall0}


def run_peer(job: PeerJob) -> Dict[str, Any]:
    """Load once, one untimed warm-up decode, then each stream count in turn."""
    model = _load(job)
    _transcribe(model, job.warmup)
    return {count: _run(model, job, count) for count in job.stream_counts}


def run_peer_isolated(job: PeerJob) -> Dict[str, Any]:
    """run_peer in a spawned child process (its own memory and threads)."""
    import multiprocessing
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(run_peer, job).result()
