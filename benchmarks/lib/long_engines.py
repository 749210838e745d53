"""Runners for long_transcribe.py, each in its own child process: this engine, faster-whisper sequential and batched."""
from __future__ import annotations

import dataclasses
import inspect
import math
import os
import tempfile
from typing import Any, Callable, Dict, List, Optional, Tuple

import seq2seq_engine  # noqa: F401,I001 - first: its OpenMP defaults must precede torch, for every engine run here

# isort: split
import torch

from benchmarks.lib.common import EngineRun, timed_run
from benchmarks.lib.whisper_engines import MAX_NEW_TOKENS, ct2_model_dir

WINDOW_S = 30.0
Segments = List[Tuple[float, float, str]]


@dataclasses.dataclass
class LongJob:
    model_name: str
    hf_dir: str
    paths: List[str]              # the recordings (16 kHz WAV)
    warmup_path: Optional[str]    # a short WAV transcribed once, untimed, before the timed runs (None: no warm-up)
    durations: List[float]        # seconds of each recording
    language: Optional[str]       # "en" for a multilingual model, None for an English-only one
    options: Dict[str, Any]       # our transcribe() keyword arguments (only those it accepts)
    threads: int = 2
    repeat: int = 1
    batch_size: int = 8           # fw-batched


def option_names() -> set:
    """The keyword options our transcribe() takes: its named parameters, plus the fields of TranscriptionOptions
    where it takes them as `**overrides` (when that class exists)."""
    from seq2seq_engine.transcription import transcribe
    parameters = inspect.signature(transcribe).parameters.values()
    names = {p.name for p in parameters if p.kind != inspect.Parameter.VAR_KEYWORD}
    if any(p.kind == inspect.Parameter.VAR_KEYWORD for p in parameters):
        try:
            from seq2seq_engine.transcription.options import TranscriptionOptions
            names |= {field.name for field in dataclasses.fields(TranscriptionOptions)}
        except ImportError:
            pass
    return names


def accepted_options(requested: Dict[str, Any]) -> Tuple[Dict[str, Any], List[str]]:
    """The requested options our transcribe() accepts (checked when the script runs), and the names it does not."""
    names = option_names()
    return {k: v for k, v in requested.items() if k in names}, [k for k in requested if k not in names]


def int8_supported() -> bool:
    """Whether the engine takes a `quantization` argument (then ours int8 = float32 activations, int8 weights)."""
    from seq2seq_engine.engine.arg_utils import EngineArgs
    return "quantization" in {f.name for f in dataclasses.fields(EngineArgs)}


def _output(text: str, segments: Segments) -> Dict[str, Any]:
    return {"text": text.strip(), "segments": segments}


# ---------------------------------------------------------------------------------------------- ours
def run_ours(job: LongJob, dtype: str) -> EngineRun:
    """LLM(dtype).transcribe(all recordings in one call, **options): its defaults unless options say otherwise
    (without timestamps, as fw-batched decodes; a window's text is then one segment, from its first speech region's
    start to its last one's end)."""
    import transformers

    from seq2seq_engine import LLM
    from seq2seq_engine.transcription.options import DEFAULT_BEAM_WIDTH
    torch.set_num_threads(job.threads)
    config = transformers.AutoConfig.from_pretrained(job.hf_dir)
    beam = int(job.options.get("beam_width") or DEFAULT_BEAM_WIDTH)
    windows = sum(max(math.ceil(d / WINDOW_S), 1) for d in job.durations)
    # Every window at full length at once (+10%), as transcribe.py sizes it: no preemption.
    per_window = math.ceil(config.max_source_positions / 16) + beam * math.ceil((4 + MAX_NEW_TOKENS + 1) / 16)
    kwargs: Dict[str, Any] = dict(dtype=dtype, num_gpu_blocks_override=int(windows * per_window * 1.1) + 16,
                                  swap_space_gb=0.01)
    if dtype == "int8":
        kwargs.update(dtype="float32", quantization="int8")
    llm = LLM(job.hf_dir, **kwargs)

    def run_once(paths: List[str]) -> List[Dict[str, Any]]:
        llm.reset_prefix_cache()  # no run reuses the encoder outputs of the warm-up or an earlier repeat
        results = llm.transcribe(paths, language=job.language, use_tqdm=False, **job.options)
        errors = [r.error for r in results if r.error]
        if errors:
            raise RuntimeError(f"{len(errors)} transcription errors, first: {errors[0]}")
        return [_output(r.text, [(s.start, s.end, s.text) for s in r.segments]) for r in results]

    return _timed(job, "ours", dtype, run_once)


def _timed(job: LongJob, engine: str, dtype: str, run_once: Callable[[List[str]], List[Any]]) -> EngineRun:
    if job.warmup_path:
        run_once([job.warmup_path])
    return timed_run(engine, dtype, job.repeat, lambda: run_once(job.paths))


# ---------------------------------------------------------------------------------------------- faster-whisper
def fw_model_dir(model_name: str, hf_dir: str) -> str:
    """The packaged CTranslate2 weights the engine loads, as faster-whisper wants them: one model.bin (the two-part
    base model joined, see ct2_model_dir) and the tokenizer.json / preprocessor_config.json it reads."""
    ct2_dir = ct2_model_dir(model_name)
    target = os.path.join(tempfile.gettempdir(), f"bench-fw-{model_name}")
    os.makedirs(target, exist_ok=True)
    for folder in (ct2_dir, hf_dir):  # CT2 files first; from the HF directory only what is still missing
        for name in os.listdir(folder):
            link = os.path.join(target, name)
            wanted = folder == ct2_dir or name in ("tokenizer.json", "preprocessor_config.json")
            if os.path.islink(link) and not os.path.exists(link):  # left by an older install: dangling
                os.remove(link)
            if wanted and not os.path.lexists(link):
                os.symlink(os.path.realpath(os.path.join(folder, name)), link)
    return target


def run_fw(job: LongJob, mode: str, compute_type: str) -> EngineRun:
    """faster-whisper with its defaults (beam 5, temperature fallback, condition on previous text), language en,
    one file at a time: `fw-seq` WhisperModel.transcribe, `fw-batched` BatchedInferencePipeline (VAD on)."""
    from faster_whisper import BatchedInferencePipeline, WhisperModel
    model = WhisperModel(fw_model_dir(job.model_name, job.hf_dir), device="cpu", compute_type=compute_type,
                         cpu_threads=job.threads)
    if mode == "fw-batched":
        pipeline = BatchedInferencePipeline(model)

        def transcribe(path: str):
            return pipeline.transcribe(path, batch_size=job.batch_size, language="en")
    else:
        def transcribe(path: str):
            return model.transcribe(path, language="en")

    def run_once(paths: List[str]) -> List[Dict[str, Any]]:
        outputs = []
        for path in paths:
            segments, _info = transcribe(path)
            segments = [(s.start, s.end, s.text) for s in segments]   # the generator does the work
            outputs.append(_output("".join(text for _, _, text in segments), segments))
        return outputs

    return _timed(job, mode, compute_type, run_once)
