"""Whisper runners for transcribe.py, each run in its own child process: this engine, HF generate (batched 30 s
windows, or its own long-form loop), CTranslate2. All at most 224 new tokens per window, no timestamps."""
from __future__ import annotations

import dataclasses
import math
import os
import tempfile
from typing import Callable, Dict, List, Optional

import seq2seq_engine  # noqa: F401,I001 - first: its OpenMP defaults must precede torch, for every engine run here

# isort: split
import numpy as np
import torch
import transformers

from benchmarks.lib.common import EngineRun, timed_run
from seq2seq_engine import LLM
from seq2seq_engine.audio import SAMPLE_RATE, is_silent
from seq2seq_engine.model_loader.resolver import SHORT_NAMES, _packaged_ct2

WINDOW = 30 * SAMPLE_RATE
MAX_NEW_TOKENS = 224


@dataclasses.dataclass
class WhisperJob:
    model_name: str
    hf_dir: str
    clips: List[np.ndarray]       # 16 kHz mono
    language: Optional[str]       # None: detected (multilingual models)
    multilingual: bool
    beam: int = 1
    threads: int = 2
    repeat: int = 1
    warmup: bool = True


def windows_of(samples: np.ndarray) -> List[np.ndarray]:
    """Fixed 30 s windows, as the engine's throughput mode splits long inputs, without the silent ones (the
    engine skips those by default, so the peers get exactly the windows it decodes)."""
    windows = [samples[i:i + WINDOW] for i in range(0, max(len(samples), 1), WINDOW)]
    return [w for w in windows if not is_silent(w)]


def batched_windows(clips: List[np.ndarray], transcribe: Callable[[List[np.ndarray]], List[str]]) -> List[str]:
    """All 30 s windows of all clips in one batch; each clip's text is its windows' texts joined."""
    windows, owner = [], []
    for i, clip in enumerate(clips):
        for window in windows_of(clip):
            windows.append(window)
            owner.append(i)
    texts = transcribe(windows) if windows else []
    joined: Dict[int, List[str]] = {}
    for i, text in zip(owner, texts):
        if text:
            joined.setdefault(i, []).append(text)
    return [" ".join(joined.get(i, [])) for i in range(len(clips))]


def _timed(job: WhisperJob, engine: str, dtype: str, run_once: Callable[[List[np.ndarray]], List[str]]) -> EngineRun:
    if job.warmup:
        run_once(job.clips[:1])
    return timed_run(engine, dtype, job.repeat, lambda: run_once(job.clips))


# ---------------------------------------------------------------------------------------------- ours
def run_ours(job: WhisperJob, dtype: str) -> EngineRun:
    torch.set_num_threads(job.threads)
    config = transformers.AutoConfig.from_pretrained(job.hf_dir)
    windows = sum(max(math.ceil(len(c) / WINDOW), 1) for c in job.clips)
    # Every window at full length at once (+10%): no preemption, no idle preallocation.
    per_window = math.ceil(config.max_source_positions / 16) + job.beam * math.ceil((4 + MAX_NEW_TOKENS + 1) / 16)
    # "int8": float32 activations around int8 Linear layers (quantization="int8").
    precision = dict(dtype="float32", quantization="int8") if dtype == "int8" else dict(dtype=dtype)
    llm = LLM(job.hf_dir, **precision, num_gpu_blocks_override=int(windows * per_window * 1.1) + 16,
              swap_space_gb=0.01)
    # temperature=0.0: one greedy (or beam) decoding per window, as the peers do; no fallback.
    kwargs = dict(language=job.language, task="transcribe", timestamps=False, use_tqdm=False,
                  max_new_tokens=MAX_NEW_TOKENS, beam_width=job.beam, temperature=0.0)

    def run_once(clips: List[np.ndarray]) -> List[str]:
        llm.reset_prefix_cache()  # no run reuses the encoder outputs of the warm-up or an earlier repeat
        results = llm.transcribe([(c, SAMPLE_RATE) for c in clips], **kwargs)
        errors = [r.error for r in results if r.error]
        if errors:
            raise RuntimeError(f"{len(errors)} transcription errors, first: {errors[0]}")
        return [r.text.strip() for r in results]

    return _timed(job, "ours", dtype, run_once)


# ---------------------------------------------------------------------------------------------- HF
def _hf_load(job: WhisperJob):
    torch.set_num_threads(job.threads)
    model = transformers.WhisperForConditionalGeneration.from_pretrained(job.hf_dir, dtype=torch.float32).eval()
    return model, transformers.WhisperProcessor.from_pretrained(job.hf_dir)


def _hf_language_kwargs(job: WhisperJob) -> dict:
    kwargs = dict(language=job.language, task="transcribe") if job.multilingual else {}
    return dict(kwargs, num_beams=job.beam) if job.beam > 1 else kwargs


def run_hf(job: WhisperJob) -> EngineRun:
    """generate() on all clips' 30 s windows in one batch."""
    model, processor = _hf_load(job)

    def transcribe(samples: List[np.ndarray]) -> List[str]:
        features = processor.feature_extractor(samples, sampling_rate=SAMPLE_RATE,
                                               return_tensors="pt").input_features
        with torch.no_grad():
            out = model.generate(features, max_new_tokens=MAX_NEW_TOKENS, return_timestamps=False,
                                 **_hf_language_kwargs(job))
        sequences = out.sequences if hasattr(out, "sequences") else out
        return [t.strip() for t in processor.batch_decode(sequences, skip_special_tokens=True)]

    return _timed(job, "hf", "float32", lambda clips: batched_windows(clips, transcribe))


def run_hf_longform(job: WhisperJob) -> EngineRun:
    """HF's own long-form path: generate() over each whole file's features, window after window (it seeks to the
    last timestamp, so it needs timestamps and its windows differ from the fixed 30 s ones)."""
    model, processor = _hf_load(job)

    def transcribe(samples: np.ndarray) -> str:
        inputs = processor.feature_extractor(samples, sampling_rate=SAMPLE_RATE, return_tensors="pt",
                                             truncation=False, padding="longest", return_attention_mask=True)
        if inputs.input_features.shape[-1] < 3000:  # short input: the ordinary (padded) path
            inputs = processor.feature_extractor(samples, sampling_rate=SAMPLE_RATE, return_tensors="pt",
                                                 return_attention_mask=True)
        with torch.no_grad():
            out = model.generate(inputs.input_features, attention_mask=inputs.attention_mask,
                                 return_timestamps=True, condition_on_prev_tokens=False, **_hf_language_kwargs(job))
        sequences = out.sequences if hasattr(out, "sequences") else out
        return processor.batch_decode(sequences, skip_special_tokens=True)[0].strip()

    return _timed(job, "hf-longform", "float32", lambda clips: [transcribe(c) for c in clips])


# ---------------------------------------------------------------------------------------------- CTranslate2
def ct2_model_dir(model_name: str) -> str:
    """A CTranslate2 directory with one model.bin (the two-part base model is joined once into a temp dir)."""
    ct2_dir, files = _packaged_ct2(model_name, SHORT_NAMES[model_name])
    if len(files) == 1 and os.path.basename(files[0]) == "model.bin":
        return ct2_dir
    target = os.path.join(tempfile.gettempdir(), f"bench-ct2-{model_name}")
    os.makedirs(target, exist_ok=True)
    for name in os.listdir(ct2_dir):
        link = os.path.join(target, name)
        if os.path.islink(link) and not os.path.exists(link):  # left by an install that is gone: dangling
            os.remove(link)
        if not name.startswith("model.bin") and not os.path.lexists(link):
            os.symlink(os.path.join(ct2_dir, name), link)
    if not os.path.exists(os.path.join(target, "model.bin")):
        with open(os.path.join(target, "model.bin.tmp"), "wb") as out:
            for part in files:
                with open(part, "rb") as f:
                    out.write(f.read())
        os.replace(os.path.join(target, "model.bin.tmp"), os.path.join(target, "model.bin"))
    return target


def _ct2_prompts(tokenizer, model, features, job: WhisperJob) -> List[List[int]]:
    """[sot, lang, transcribe, notimestamps] per window (language detected by CT2 when None)."""
    ids = tokenizer.convert_tokens_to_ids
    if not job.multilingual:
        return [ids(["<|startoftranscript|>", "<|notimestamps|>"])] * features.shape[0]
    if job.language is None:
        languages = [result[0][0] for result in model.detect_language(features)]
    else:
        languages = [f"<|{job.language}|>"] * features.shape[0]
    return [ids(["<|startoftranscript|>", lang, "<|transcribe|>", "<|notimestamps|>"]) for lang in languages]


def run_ct2(job: WhisperJob, compute_type: str) -> EngineRun:
    import ctranslate2
    model = ctranslate2.models.Whisper(ct2_model_dir(job.model_name), device="cpu", compute_type=compute_type,
                                       intra_threads=job.threads)
    processor = transformers.WhisperProcessor.from_pretrained(job.hf_dir)

    def transcribe(samples: List[np.ndarray]) -> List[str]:
        array = processor.feature_extractor(samples, sampling_rate=SAMPLE_RATE, return_tensors="np").input_features
        features = ctranslate2.StorageView.from_array(np.ascontiguousarray(array, dtype=np.float32))
        prompts = _ct2_prompts(processor.tokenizer, model, features, job)
        results = model.generate(features, prompts, beam_size=job.beam, max_length=448, suppress_blank=True)
        return [processor.tokenizer.decode(r.sequences_ids[0], skip_special_tokens=True).strip() for r in results]

    return _timed(job, "ct2", compute_type, lambda clips: batched_windows(clips, transcribe))
