"""Whisper transcription speed and accuracy: this engine vs HF transformers generate() vs CTranslate2, one process."""
from __future__ import annotations

import argparse
import dataclasses
import gc
import glob
import importlib.util
import os
import sys
import tempfile
import time
from typing import Callable, Dict, List, Optional

import numpy as np
import seq2seq_engine  # noqa: F401,I001 - first: its OpenMP defaults must precede torch, for every engine run here
import torch
import transformers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from wer import corpus_wer  # noqa: E402

from seq2seq_engine import LLM  # noqa: E402
from seq2seq_engine.audio import SAMPLE_RATE, is_silent, load_audio  # noqa: E402
from seq2seq_engine.model_resolver import SHORT_NAMES, _packaged_ct2, resolve_model_path  # noqa: E402
from seq2seq_engine.transcription.pipeline import whisper_tokens_for  # noqa: E402

WINDOW = 30 * SAMPLE_RATE
MAX_NEW_TOKENS = 224


@dataclasses.dataclass
class Clip:
    name: str
    language: str          # the folder's language (the reference's)
    samples: np.ndarray
    reference: Optional[str]


@dataclasses.dataclass
class Run:
    engine: str
    dtype: str
    wall: float
    texts: List[str]


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", choices=["whisper-base", "whisper-tiny.en"], default="whisper-base")
    parser.add_argument("--clips", choices=["en", "all"], default="en")
    parser.add_argument("--repeat-to", type=int, default=0, help="repeat the clip list up to N clips")
    parser.add_argument("--long", action="store_true", help="one ~5 min file: clips joined with 1 s silences")
    parser.add_argument("--long-seconds", type=float, default=300.0)
    parser.add_argument("--language", default="auto",
                        help="auto: 'en' for English clips on a multilingual model, detected for --clips all")
    parser.add_argument("--engines", default="ours,hf,ct2", help="comma list of ours, hf, hf-longform, ct2 (hf: all 30 s windows in one batch; hf-longform: "
                             "generate() on each whole file, window after window, with timestamps)")
    parser.add_argument("--ours-dtypes", default="float32,bfloat16")
    parser.add_argument("--ct2-dtypes", default="float32,int8")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--show-texts", action="store_true", help="print every clip's transcripts")
    return parser.parse_args(argv)


# ---------------------------------------------------------------------------------------------- clips
def sample_dir() -> str:
    spec = importlib.util.find_spec("pytest_audioeval")
    if spec is None:
        raise SystemExit("pytest-audioeval is not installed")
    return os.path.join(list(spec.submodule_search_locations)[0], "samples", "audio")


def load_clips(which: str, repeat_to: int) -> List[Clip]:
    clips = []
    for path in sorted(glob.glob(os.path.join(sample_dir(), "*", "*.wav"))):
        language = os.path.basename(os.path.dirname(path))
        if which == "en" and language != "en":
            continue
        ref_path = path[:-4] + ".txt"
        reference = open(ref_path, encoding="utf-8").read().strip() if os.path.exists(ref_path) else None
        clips.append(Clip(f"{language}/{os.path.basename(path)}", language, load_audio(path), reference))
    base = list(clips)
    while len(clips) < repeat_to:
        clips.append(base[len(clips) % len(base)])
    return clips


def long_clip(clips: List[Clip], seconds: float) -> Clip:
    """Clips joined with 1 s silences (cycling) up to `seconds`; the reference is their references joined."""
    pieces, refs, total, i = [], [], 0, 0
    silence = np.zeros(SAMPLE_RATE, np.float32)
    while total < seconds * SAMPLE_RATE:
        clip = clips[i % len(clips)]
        pieces += [clip.samples, silence]
        refs.append(clip.reference or "")
        total += len(clip.samples) + len(silence)
        i += 1
    return Clip(f"long({i} clips)", clips[0].language, np.concatenate(pieces), " ".join(refs))


def windows_of(samples: np.ndarray) -> List[np.ndarray]:
    """Fixed 30 s windows, as the engine's throughput mode splits long inputs, without the silent ones (the
    engine skips those by default, so the peers get exactly the windows it decodes)."""
    windows = [samples[i:i + WINDOW] for i in range(0, max(len(samples), 1), WINDOW)]
    return [w for w in windows if not is_silent(w)]


# ---------------------------------------------------------------------------------------------- engines
def run_ours(hf_dir: str, dtype: str, clips: List[Clip], language: Optional[str]) -> Run:
    llm = LLM(hf_dir, dtype=dtype, kv_cache_space_gb=1.0, swap_space_gb=0.01)
    kwargs = dict(language=language, task="transcribe", timestamps=False, use_tqdm=False,
                  max_new_tokens=MAX_NEW_TOKENS)
    llm.transcribe([(clips[0].samples, SAMPLE_RATE)], **kwargs)  # warm-up
    start = time.perf_counter()
    results = llm.transcribe([(c.samples, SAMPLE_RATE) for c in clips], **kwargs)
    wall = time.perf_counter() - start
    errors = [r.error for r in results if r.error]
    if errors:
        print(f"  ours {dtype}: {len(errors)} errors, first: {errors[0]}")
    del llm
    gc.collect()
    return Run("ours", dtype, wall, [r.text.strip() for r in results])


def hf_generate(model, processor, samples: List[np.ndarray], language, multilingual: bool) -> List[str]:
    features = processor.feature_extractor(samples, sampling_rate=SAMPLE_RATE, return_tensors="pt").input_features
    kwargs = dict(language=language, task="transcribe") if multilingual else {}
    with torch.no_grad():
        out = model.generate(features, max_new_tokens=MAX_NEW_TOKENS, return_timestamps=False, **kwargs)
    sequences = out.sequences if hasattr(out, "sequences") else out
    return [t.strip() for t in processor.batch_decode(sequences, skip_special_tokens=True)]


def run_hf(hf_dir: str, clips: List[Clip], language: Optional[str], multilingual: bool) -> Run:
    model = transformers.WhisperForConditionalGeneration.from_pretrained(hf_dir, dtype=torch.float32).eval()
    processor = transformers.WhisperProcessor.from_pretrained(hf_dir)
    hf_generate(model, processor, [clips[0].samples], language, multilingual)  # warm-up
    start = time.perf_counter()
    texts = batched_windows(clips, lambda s: hf_generate(model, processor, s, language, multilingual))
    wall = time.perf_counter() - start
    del model
    gc.collect()
    return Run("hf", "float32", wall, texts)


def run_hf_longform(hf_dir: str, clips: List[Clip], language: Optional[str], multilingual: bool) -> Run:
    """HF's own long-form path: generate() over each whole file's features, window after window (it seeks to the
    last timestamp, so it needs timestamps and its windows differ from the fixed 30 s ones)."""
    model = transformers.WhisperForConditionalGeneration.from_pretrained(hf_dir, dtype=torch.float32).eval()
    processor = transformers.WhisperProcessor.from_pretrained(hf_dir)
    kwargs = dict(language=language, task="transcribe") if multilingual else {}

    def transcribe(samples: np.ndarray) -> str:
        inputs = processor.feature_extractor(samples, sampling_rate=SAMPLE_RATE, return_tensors="pt",
                                             truncation=False, padding="longest", return_attention_mask=True)
        if inputs.input_features.shape[-1] < 3000:  # short input: the ordinary (padded) path
            inputs = processor.feature_extractor(samples, sampling_rate=SAMPLE_RATE, return_tensors="pt",
                                                 return_attention_mask=True)
        with torch.no_grad():
            out = model.generate(inputs.input_features, attention_mask=inputs.attention_mask,
                                 return_timestamps=True, condition_on_prev_tokens=False, **kwargs)
        sequences = out.sequences if hasattr(out, "sequences") else out
        return processor.batch_decode(sequences, skip_special_tokens=True)[0].strip()

    transcribe(clips[0].samples)  # warm-up
    start = time.perf_counter()
    texts = [transcribe(clip.samples) for clip in clips]
    wall = time.perf_counter() - start
    del model
    gc.collect()
    return Run("hf-longform", "float32", wall, texts)


def batched_windows(clips: List[Clip], transcribe: Callable[[List[np.ndarray]], List[str]]) -> List[str]:
    """All 30 s windows of all clips in one batch; each clip's text is its windows' texts joined."""
    windows, owner = [], []
    for i, clip in enumerate(clips):
        for window in windows_of(clip.samples):
            windows.append(window)
            owner.append(i)
    texts = transcribe(windows) if windows else []
    joined: Dict[int, List[str]] = {}
    for i, text in zip(owner, texts):
        if text:
            joined.setdefault(i, []).append(text)
    return [" ".join(joined.get(i, [])) for i in range(len(clips))]


def ct2_model_dir(model_name: str) -> str:
    """A CTranslate2 directory with one model.bin (the two-part base model is joined once into a temp dir)."""
    ct2_dir, files = _packaged_ct2(model_name, SHORT_NAMES[model_name])
    if len(files) == 1 and os.path.basename(files[0]) == "model.bin":
        return ct2_dir
    target = os.path.join(tempfile.gettempdir(), f"bench-ct2-{model_name}")
    if not os.path.exists(os.path.join(target, "model.bin")):
        os.makedirs(target, exist_ok=True)
        for name in os.listdir(ct2_dir):
            if not name.startswith("model.bin"):
                link = os.path.join(target, name)
                if not os.path.exists(link):
                    os.symlink(os.path.join(ct2_dir, name), link)
        with open(os.path.join(target, "model.bin.tmp"), "wb") as out:
            for part in files:
                with open(part, "rb") as f:
                    out.write(f.read())
        os.replace(os.path.join(target, "model.bin.tmp"), os.path.join(target, "model.bin"))
    return target


def ct2_prompts(tokenizer, model, features, language: Optional[str], multilingual: bool) -> List[List[int]]:
    """[sot, lang, transcribe, notimestamps] per window (language detected by CT2 when None)."""
    ids = tokenizer.convert_tokens_to_ids
    if not multilingual:
        return [ids(["<|startoftranscript|>", "<|notimestamps|>"])] * features.shape[0]
    if language is None:
        languages = [result[0][0] for result in model.detect_language(features)]
    else:
        languages = [f"<|{language}|>"] * features.shape[0]
    return [ids(["<|startoftranscript|>", lang, "<|transcribe|>", "<|notimestamps|>"]) for lang in languages]


def ct2_generate(model, processor, samples, language, multilingual: bool) -> List[str]:
    import ctranslate2
    array = processor.feature_extractor(samples, sampling_rate=SAMPLE_RATE, return_tensors="np").input_features
    features = ctranslate2.StorageView.from_array(np.ascontiguousarray(array, dtype=np.float32))
    prompts = ct2_prompts(processor.tokenizer, model, features, language, multilingual)
    results = model.generate(features, prompts, beam_size=1, max_length=448, suppress_blank=True)
    return [processor.tokenizer.decode(r.sequences_ids[0], skip_special_tokens=True).strip() for r in results]


def run_ct2(model_name: str, hf_dir: str, compute_type: str, clips: List[Clip], language, multilingual: bool,
            threads: int) -> Run:
    import ctranslate2
    model = ctranslate2.models.Whisper(ct2_model_dir(model_name), device="cpu", compute_type=compute_type,
                                       intra_threads=threads)
    processor = transformers.WhisperProcessor.from_pretrained(hf_dir)
    ct2_generate(model, processor, [clips[0].samples], language, multilingual)  # warm-up
    start = time.perf_counter()
    texts = batched_windows(clips, lambda s: ct2_generate(model, processor, s, language, multilingual))
    wall = time.perf_counter() - start
    del model
    gc.collect()
    return Run("ct2", compute_type, wall, texts)


# ---------------------------------------------------------------------------------------------- report
def print_table(runs: List[Run], clips: List[Clip]) -> None:
    audio = sum(len(c.samples) for c in clips) / SAMPLE_RATE
    ours = next((r for r in runs if r.engine == "ours"), runs[0])
    english = [i for i, c in enumerate(clips) if c.language == "en" and c.reference]
    header = "| engine | dtype | clips | audio s | wall s | RTF (audio/wall) | speed vs ours | WER en | same text as ours |"
    print(header)
    print("|---" * 9 + "|")
    for run in runs:
        wer = corpus_wer((clips[i].reference, run.texts[i]) for i in english) if english else float("nan")
        same = sum(a == b for a, b in zip(run.texts, ours.texts))
        print(f"| {run.engine} | {run.dtype} | {len(clips)} | {audio:.1f} | {run.wall:.2f} | {audio / run.wall:.2f} | "
              f"{ours.wall / run.wall:.2f}x | {wer:.3f} | {same}/{len(clips)} ({same / len(clips):.0%}) |")


def print_texts(runs: List[Run], clips: List[Clip]) -> None:
    seen = set()
    for i, clip in enumerate(clips):
        if clip.name in seen:
            continue
        seen.add(clip.name)
        print(f"{clip.name}  ref: {clip.reference!r}")
        for run in runs:
            print(f"    {run.engine:4s} {run.dtype:8s} {run.texts[i]!r}")


def resolve_language(args, multilingual: bool) -> Optional[str]:
    if args.language != "auto":
        return None if args.language in ("none", "detect") else args.language
    return "en" if multilingual and args.clips == "en" else None


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    hf_dir = resolve_model_path(args.model)
    multilingual = transformers.AutoConfig.from_pretrained(hf_dir).vocab_size >= 51865
    language = resolve_language(args, multilingual)
    clips = load_clips(args.clips, args.repeat_to)
    if args.long:
        clips = [long_clip(clips, args.long_seconds)]
    engines = args.engines.split(",")
    shown = language or ("detected" if multilingual else "en (English-only model)")
    print(f"model={args.model} clips={len(clips)} language={shown} threads={args.threads} "
          f"torch={torch.__version__} transformers={transformers.__version__}", flush=True)
    runs: List[Run] = []
    for dtype in args.ours_dtypes.split(",") if "ours" in engines else []:
        try:
            runs.append(run_ours(hf_dir, dtype, clips, language))
        except Exception as error:  # noqa: BLE001 - e.g. a dtype the engine refuses: report and go on
            print(f"  ours {dtype}: failed: {type(error).__name__}: {error}", flush=True)
    if "hf" in engines:
        runs.append(run_hf(hf_dir, clips, language, multilingual))
    if "hf-longform" in engines:
        runs.append(run_hf_longform(hf_dir, clips, language, multilingual))
    if "ct2" in engines:
        if importlib.util.find_spec("ctranslate2") is None:
            print("  ct2: ctranslate2 is not installed, skipped")
        for compute_type in args.ct2_dtypes.split(",") if importlib.util.find_spec("ctranslate2") else []:
            runs.append(run_ct2(args.model, hf_dir, compute_type, clips, language, multilingual, args.threads))
    if args.show_texts:
        print_texts(runs, clips)
    print_table(runs, clips)
    return 0


if __name__ == "__main__":
    sys.exit(main())
