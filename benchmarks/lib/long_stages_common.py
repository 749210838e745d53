"""long_stages.py's shared parts: the job a child runs, stage timing (wall and process CPU), the recording's file and
the encoder's FLOP count."""
from __future__ import annotations

import dataclasses
import math
import os
import time
from typing import Any, Callable, Dict, Optional, Tuple

import numpy as np

from benchmarks.lib.common import EngineRun, RssSampler, rss_mib

# (key, row label); "decoder" and "words" are derived (see derive), "e2e" is the transcribe call itself
STAGES = [
    ("decode", "container decode + resample to 16 kHz mono"),
    ("vad", "VAD (Silero)"),
    ("pack", "packing speech into windows"),
    ("features", "log-mel features"),
    ("encoder", "encoder"),
    ("decoder", "decoder + the rest (end-to-end - the above)"),
    ("words", "word-timestamp alignment (with - without)"),
    ("srt", "srt render (after transcribe)"),
    ("e2e", "end-to-end transcribe"),
]
MEASURED = ("decode", "vad", "pack", "features", "encoder")   # timed apart, outside the transcribe call
Times = Tuple[float, float]   # (wall s, process CPU s)


@dataclasses.dataclass
class StageJob:
    model_name: str
    hf_dir: str
    path: str                     # the long recording
    warmup_path: str              # a 10 s piece of it, transcribed once untimed
    language: Optional[str]       # "en" on a multilingual model, None on an English-only one
    compute: str                  # "int8" or "float32", both engines
    beam_width: int = 5
    word_timestamps: bool = False
    threads: int = 2
    batch_size: int = 8           # faster-whisper's BatchedInferencePipeline
    max_in_flight: Optional[int] = None   # ours: windows in the engine at once (None: its default, by KV budget)


def timed(fn: Callable[[], Any]) -> Tuple[Any, Times]:
    """fn()'s result and (wall seconds, this process's CPU seconds, all threads) it took."""
    wall, cpu = time.perf_counter(), time.process_time()
    result = fn()
    return result, (time.perf_counter() - wall, time.process_time() - cpu)


def end_to_end(transcribe: Callable[[bool], Any], words: bool) -> Tuple[Any, Times, Optional[Times], Tuple]:
    """The timed end-to-end calls: `transcribe(False)`, and `transcribe(True)` when `words` (the output as asked);
    (the last output, times without words, times with them or None, (RSS before, peak RSS during) in MiB)."""
    load_rss = rss_mib()
    with RssSampler(interval=0.05) as sampler:   # 20 polls a second: next to nothing in the CPU time
        output, e2e = timed(lambda: transcribe(False))
        e2e_words = None
        if words:
            output, e2e_words = timed(lambda: transcribe(True))
    return output, e2e, e2e_words, (load_rss, sampler.peak)


def add(*times: Times) -> Times:
    return sum(t[0] for t in times), sum(t[1] for t in times)


def minus(a: Times, b: Times) -> Times:
    return a[0] - b[0], a[1] - b[1]


def derive(stages: Dict[str, Times], e2e: Times, e2e_words: Optional[Times]) -> Dict[str, Optional[Times]]:
    """Every stage row: the measured ones, decoder = end-to-end without words - the measured ones, words = with -
    without (None when not asked), e2e = the transcribe call as asked (with words when asked)."""
    rows: Dict[str, Optional[Times]] = dict(stages)
    rows["decoder"] = minus(e2e, add(*(stages[key] for key in MEASURED)))
    rows["words"] = minus(e2e_words, e2e) if e2e_words is not None else None
    rows["e2e"] = e2e_words if e2e_words is not None else e2e
    return rows


def finish(engine: str, job: StageJob, stages: Dict[str, Times], e2e: Times, e2e_words: Optional[Times],
           info: Dict[str, Any], memory: Tuple[float, float]) -> EngineRun:
    """The child's EngineRun: wall = the end-to-end call as asked, outputs = [{"stages": ..., "info": ...}],
    memory = (RSS after the warm-up, peak RSS during the end-to-end calls) in MiB."""
    rows = derive(stages, e2e, e2e_words)
    record = {"stages": rows, "info": info}
    return EngineRun(engine, job.compute, rows["e2e"][0], [record], memory[0], memory[1], walls=[rows["e2e"][0]])


def encoder_gflop(config: Any) -> float:
    """GFLOP (2 per multiply-add) of one 30 s window through Whisper's encoder: both convolutions, each layer's
    linears (q, k, v, out, fc1, fc2) and attention (scores and weighted values over the window's positions)."""
    d, ffn, positions = config.d_model, config.encoder_ffn_dim, config.max_source_positions
    convs = 2 * config.num_mel_bins * 3 * d * 2 * positions + 2 * d * 3 * d * positions
    linears = 2 * positions * (4 * d * d + 2 * d * ffn)
    attention = 2 * 2 * positions * positions * d
    return (convs + config.encoder_layers * (linears + attention)) / 1e9


def gemm_gflops(config: Any, repeat: int = 5) -> float:
    """GFLOP/s of torch's float32 matmul at the encoder's fc1 shape ([positions, d] x [d, ffn]), best of `repeat`."""
    import torch
    a = torch.randn(config.max_source_positions, config.d_model)
    b = torch.randn(config.d_model, config.encoder_ffn_dim)
    torch.mm(a, b)
    best = math.inf
    for _ in range(repeat):
        start = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - start)
    return 2 * a.shape[0] * a.shape[1] * b.shape[1] / best / 1e9


def write_recording(samples: np.ndarray, folder: str, name: str, fmt: str, rate: int) -> str:
    """`samples` (16 kHz mono) as `name`.wav (PCM 16 at `rate`, mono) or `name`.mp3 (`rate`, stereo, as a meeting
    recorder writes it); its path."""
    import soundfile

    from seq2seq_engine.audio import SAMPLE_RATE, resample
    audio = resample(samples, SAMPLE_RATE, rate) if rate != SAMPLE_RATE else samples
    path = os.path.join(folder, f"{name}.{fmt}")
    if fmt == "mp3":
        soundfile.write(path, np.stack([audio, audio], axis=1), rate, format="MP3")
    else:
        soundfile.write(path, audio, rate, subtype="PCM_16")
    return path


def srt_text(segments: Any) -> str:
    """(start, end, text) segments as SubRip, the way a faster-whisper user writes them out."""
    def stamp(seconds: float) -> str:
        millis = int(round(seconds * 1000))
        return f"{millis // 3_600_000:02d}:{millis // 60_000 % 60:02d}:{millis // 1000 % 60:02d},{millis % 1000:03d}"
    return "".join(f"{i}\n{stamp(start)} --> {stamp(end)}\n{text.strip()}\n\n"
                   for i, (start, end, text) in enumerate(segments, 1))
