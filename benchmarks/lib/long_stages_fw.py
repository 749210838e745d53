"""long_stages.py's run of faster-whisper's BatchedInferencePipeline in a child process: the end-to-end call, then
each stage timed apart from outside, as its `transcribe` runs them (faster_whisper/transcribe.py, 1.2.1)."""
from __future__ import annotations

import os
import tempfile
from typing import Any, List, Tuple

import numpy as np

from benchmarks.lib.common import EngineRun
from benchmarks.lib.long_engines import fw_model_dir
from benchmarks.lib.long_stages_common import StageJob, Times, end_to_end, finish, srt_text, timed

SAMPLE_RATE = 16000
CHUNK_S = 30   # the feature extractor's chunk_length: the pipeline's VAD max_speech_duration_s and chunk length


def transcribe(pipeline: Any, job: StageJob, path: str, words: bool) -> List[Tuple[float, float, str]]:
    """BatchedInferencePipeline.transcribe(path, beam_size, batch_size, vad_filter=True), the segments generator
    consumed (it does the decoding)."""
    segments, _info = pipeline.transcribe(path, language="en", beam_size=job.beam_width, batch_size=job.batch_size,
                                          vad_filter=True, word_timestamps=words)
    return [(s.start, s.end, s.text) for s in segments]


def input_stages(model: Any, job: StageJob) -> tuple:
    """(stage times, info): decode_audio, get_speech_timestamps with the options the pipeline uses when given no
    vad_parameters, collect_chunks, the feature extractor on every chunk (stacked, padded to 30 s) and
    model.encode in batches of batch_size."""
    from faster_whisper.audio import decode_audio, pad_or_trim
    from faster_whisper.vad import VadOptions, collect_chunks, get_speech_timestamps
    audio, decode = timed(lambda: decode_audio(job.path, sampling_rate=SAMPLE_RATE))
    options = VadOptions(max_speech_duration_s=CHUNK_S, min_silence_duration_ms=160)
    stamps, vad = timed(lambda: get_speech_timestamps(audio, options))
    (chunks, _metadata), pack = timed(lambda: collect_chunks(audio, stamps, max_duration=CHUNK_S))
    features, feats = timed(lambda: np.stack([pad_or_trim(model.feature_extractor(chunk)[..., :-1])
                                              for chunk in chunks]))
    batch = job.batch_size
    _, encoder = timed(lambda: [model.encode(features[i:i + batch]) for i in range(0, len(features), batch)])
    speech = sum(s["end"] - s["start"] for s in stamps) / SAMPLE_RATE
    stages = {"decode": decode, "vad": vad, "pack": pack, "features": feats, "encoder": encoder}
    return stages, {"windows": len(chunks), "encoder_batch": batch, "speech_s": speech}


def srt_stage(segments: List[Tuple[float, float, str]], folder: str) -> Times:
    def write() -> None:
        with open(os.path.join(folder, "fw.srt"), "w", encoding="utf-8") as out:
            out.write(srt_text(segments))
    return timed(write)[1]


def run_fw_stages(job: StageJob) -> EngineRun:
    """Load WhisperModel on the same CTranslate2 weights, warm up on the 10 s file, the end-to-end call (and with
    words), then the stages apart."""
    from faster_whisper import BatchedInferencePipeline, WhisperModel
    model = WhisperModel(fw_model_dir(job.model_name, job.hf_dir), device="cpu", compute_type=job.compute,
                         cpu_threads=job.threads)
    pipeline = BatchedInferencePipeline(model)
    transcribe(pipeline, job, job.warmup_path, job.word_timestamps)
    segments, e2e, e2e_words, memory = end_to_end(lambda words: transcribe(pipeline, job, job.path, words),
                                                  job.word_timestamps)
    stages, info = input_stages(model, job)
    with tempfile.TemporaryDirectory() as folder:
        stages["srt"] = srt_stage(segments, folder)
    info.update(text="".join(text for _, _, text in segments).strip(), segments=len(segments),
                fallback_segments=0)   # the batched pipeline decodes at the first temperature only
    return finish("fw", job, stages, e2e, e2e_words, info, memory)
