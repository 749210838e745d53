"""long_stages.py's run of this engine in a child process: the end-to-end `llm.transcribe` call, then each stage of
it timed apart on the same file, the way the pipeline runs it (transcription/input/window_source.py)."""
from __future__ import annotations

import os
import tempfile
from typing import Any, List

import seq2seq_engine  # noqa: F401,I001 - first: its OpenMP defaults must precede torch

# isort: split
import numpy as np
import torch

from benchmarks.lib.common import EngineRun
from benchmarks.lib.long_stages_common import StageJob, Times, encoder_gflop, end_to_end, finish, gemm_gflops, timed

PROMPT_TOKENS = 4   # a window's decoder prompt, next to its encoder positions in a prefill step's token budget


def load(job: StageJob) -> Any:
    from seq2seq_engine import LLM
    torch.set_num_threads(job.threads)
    precision = dict(dtype="float32", quantization="int8") if job.compute == "int8" else dict(dtype=job.compute)
    return LLM(job.hf_dir, swap_space_gb=0.01, **precision)


def transcribe(llm: Any, job: StageJob, path: str, words: bool) -> Any:
    """llm.transcribe of one file with VAD on, beam `job.beam_width`, the engine's other defaults (temperature
    fallback included); the encoder cache emptied first, so no run reuses an earlier one's encoder outputs."""
    llm.reset_prefix_cache()
    (result,) = llm.transcribe([path], language=job.language, vad_filter=True, beam_width=job.beam_width,
                               word_timestamps=words, use_tqdm=False, max_in_flight=job.max_in_flight)
    if result.error:
        raise RuntimeError(f"transcription failed: {result.error}")
    return result


@torch.inference_mode()
def run_encoder(model: Any, features: List[torch.Tensor], batch: int) -> None:
    """The model's encoder (models/whisper.py: encode) over every window, `batch` windows per call, with the
    block-diagonal metadata of a prefill step that runs only encoders (models/whisper_alignment.py builds it). No
    cross K/V projection, no decoder: those stay in the decoder row, as faster-whisper's do."""
    from seq2seq_engine.models.whisper_alignment import prefill_metadata
    frames = model.model.encoder.max_source_positions
    for start in range(0, len(features), batch):
        chunk = torch.stack(features[start:start + batch])
        model.encode(prefill_metadata([frames] * len(chunk), None, chunk.device, encoder=True),
                     encoder_features=chunk)


def input_stages(llm: Any, path: str) -> tuple:
    """(stage times, info): the one pass over the file that vad_filter makes, in Silero blocks (decode), the VAD on
    the decoded blocks, then the packing, the features and the encoder of every window (the encoder as a prefill
    step batches them: its token budget over a window's encoder positions and prompt)."""
    from seq2seq_engine.audio import SAMPLE_RATE, encoder_window_samples, iter_windows
    from seq2seq_engine.audio.silero import BLOCK_FRAMES, FRAME_SAMPLES, load_silero_vad
    from seq2seq_engine.audio.vad import regions_from_probabilities
    from seq2seq_engine.transcription.input.vad_windows import speech_windows, window_vad_options
    from seq2seq_engine.transcription.input.windows import features_for
    engine = llm.llm_engine
    window = encoder_window_samples(engine.max_encoder_len)
    blocks, decode = timed(lambda: list(iter_windows(path, BLOCK_FRAMES * FRAME_SAMPLES)))
    options = window_vad_options(True, None, window)
    length = sum(len(block) for block in blocks)
    regions, vad = timed(lambda: regions_from_probabilities(
        load_silero_vad().stream_probabilities(iter(blocks)), length, options))
    audio = np.concatenate(blocks)
    windows, pack = timed(lambda: speech_windows(audio, regions, window))
    features, feats = timed(lambda: [features_for(engine, w.samples) for w in windows])
    batch = max(1, engine.scheduler_config.max_num_batched_tokens // (engine.max_encoder_len + PROMPT_TOKENS))
    _, encoder = timed(lambda: run_encoder(engine.model_runner.model, features, batch))
    stages = {"decode": decode, "vad": vad, "pack": pack, "features": feats, "encoder": encoder}
    speech = sum(end - start for start, end in regions) / SAMPLE_RATE
    return stages, {"windows": len(windows), "encoder_batch": batch, "speech_s": speech}


def srt_stage(result: Any, folder: str) -> Times:
    from seq2seq_engine.transcription import render

    def write() -> None:
        with open(os.path.join(folder, "ours.srt"), "w", encoding="utf-8") as out:
            out.write(render(result, "srt"))
    return timed(write)[1]


def run_ours_stages(job: StageJob) -> EngineRun:
    """Load, warm up on the 10 s file, the end-to-end call (and with words), then the stages apart."""
    llm = load(job)
    transcribe(llm, job, job.warmup_path, job.word_timestamps)
    result, e2e, e2e_words, memory = end_to_end(lambda words: transcribe(llm, job, job.path, words),
                                                job.word_timestamps)
    stages, info = input_stages(llm, job.path)
    with tempfile.TemporaryDirectory() as folder:
        stages["srt"] = srt_stage(result, folder)
    config = llm.llm_engine.hf_config
    info.update(text=result.text.strip(), segments=len(result.segments),
                fallback_segments=sum(bool(s.temperature) for s in result.segments),
                encoder_gflop_per_window=encoder_gflop(config), gemm_gflops=gemm_gflops(config))
    return finish("ours", job, stages, e2e, e2e_words, info, memory)
