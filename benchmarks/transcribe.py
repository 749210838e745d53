"""Whisper transcription speed and accuracy: this engine vs HF transformers generate() vs CTranslate2, one command
(each engine in its own child process; see lib/common.py).

    .venv/bin/python -m benchmarks.transcribe                    # whisper-base, 32 short English clips, greedy
    .venv/bin/python -m benchmarks.transcribe --beam 5           # the same with beam search (width 5)
    .venv/bin/python -m benchmarks.transcribe --long             # one ~5 min file
    .venv/bin/python -m benchmarks.transcribe --quick            # smoke run: tiny.en, 4 clips
"""
from __future__ import annotations

import argparse
import sys
from typing import List, Optional

import seq2seq_engine  # noqa: F401,I001 - first: its OpenMP defaults must precede torch

# isort: split
import transformers

from benchmarks.lib.clips import Clip, load_clips, long_clip
from benchmarks.lib.common import (EngineRun, EngineSpec, add_timing_args, ct2_installed, print_run_header,
                                   reference_run, run_rounds, speed_table)
from benchmarks.lib.wer import corpus_wer
from benchmarks.lib.whisper_engines import WhisperJob, run_ct2, run_hf, run_hf_longform, run_ours
from seq2seq_engine.audio import SAMPLE_RATE
from seq2seq_engine.model_loader.resolver import resolve_model_path


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=["whisper-base", "whisper-tiny.en"], default=None,
                        help="default: whisper-base (whisper-tiny.en with --quick)")
    parser.add_argument("--clips", choices=["en", "all"], default="en")
    parser.add_argument("--repeat-to", type=int, default=32, help="repeat the clip list up to N clips (0: as is)")
    parser.add_argument("--long", action="store_true", help="one ~5 min file: clips joined with 1 s silences")
    parser.add_argument("--long-seconds", type=float, default=300.0)
    parser.add_argument("--language", default="auto",
                        help="auto: 'en' for English clips on a multilingual model, detected for --clips all")
    parser.add_argument("--beam", type=int, default=1, help="beam width (1: greedy) for every engine")
    parser.add_argument("--engines", default="ours,hf,ct2",
                        help="comma list of ours, hf, hf-longform, ct2 (hf: all 30 s windows in one batch; "
                             "hf-longform: generate() on each whole file, window after window, with timestamps)")
    parser.add_argument("--ours-dtypes", default="float32,bfloat16",
                        help="comma list of float32, bfloat16, int8 (float32 with quantization='int8')")
    parser.add_argument("--ct2-dtypes", default="float32,int8")
    parser.add_argument("--threads", type=int, default=2, help="torch threads and CT2 intra_threads")
    add_timing_args(parser)
    parser.add_argument("--no-warmup", action="store_true", help="skip the untimed one-clip warm-up")
    parser.add_argument("--show-texts", action="store_true", help="print every clip's transcripts")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: whisper-tiny.en unless --model is given, 4 clips (or a 40 s --long file)")
    args = parser.parse_args(argv)
    if args.quick:
        args.repeat_to, args.long_seconds = 4, 40.0
    args.model = args.model or ("whisper-tiny.en" if args.quick else "whisper-base")
    return args


# ---------------------------------------------------------------------------------------------- report
def print_table(runs: List[EngineRun], clips: List[Clip]) -> None:
    """Speed (RTF = audio s / wall s), memory, ratios, WER on the English clips, transcripts equal to ours."""
    audio = sum(len(c.samples) for c in clips) / SAMPLE_RATE
    english = [i for i, c in enumerate(clips) if c.language == "en" and c.reference]
    ours_fp32 = reference_run(runs)

    def first_cells(run: EngineRun) -> List[str]:
        wer = corpus_wer((clips[i].reference, run.outputs[i]) for i in english) if english else float("nan")
        vs_ours = (corpus_wer((ours_fp32.outputs[i], run.outputs[i]) for i in english)
                   if english and ours_fp32 else float("nan"))
        return [str(len(clips)), f"{audio:.1f}", f"{wer:.3f}", f"{vs_ours:.3f}"]

    speed_table(runs, ["clips", "audio s", "WER en", "WER en vs ours-float32"], first_cells, "RTF (audio/wall)",
                lambda r: audio / r.wall)
    print("(same as ours-float32: transcripts identical as strings; common prefix: in characters)")


def print_texts(runs: List[EngineRun], clips: List[Clip]) -> None:
    seen = set()
    for i, clip in enumerate(clips):
        if clip.name in seen:
            continue
        seen.add(clip.name)
        print(f"{clip.name}  ref: {clip.reference!r}")
        for run in runs:
            print(f"    {run.engine:11s} {run.dtype:8s} {run.outputs[i]!r}")


def resolve_language(args, multilingual: bool) -> Optional[str]:
    if args.language != "auto":
        return None if args.language in ("none", "detect") else args.language
    return "en" if multilingual and args.clips == "en" else None


def run_engines(args: argparse.Namespace, job: WhisperJob) -> List[EngineRun]:
    engines = args.engines.split(",")
    specs: List[EngineSpec] = []
    for dtype in args.ours_dtypes.split(",") if "ours" in engines else []:
        specs.append(EngineSpec(f"ours {dtype}", run_ours, (job, dtype)))
    if "hf" in engines:
        specs.append(EngineSpec("hf float32", run_hf, (job,)))
    if "hf-longform" in engines:
        specs.append(EngineSpec("hf-longform float32", run_hf_longform, (job,)))
    if "ct2" in engines and not ct2_installed():
        print("  ct2: ctranslate2 is not installed, skipped", flush=True)
    elif "ct2" in engines:
        for compute_type in args.ct2_dtypes.split(","):
            specs.append(EngineSpec(f"ct2 {compute_type}", run_ct2, (job, compute_type)))
    failures: List[str] = []
    runs = run_rounds(specs, args.rounds, failures)
    for failure in failures:
        print(f"FAILED: {failure}")
    return runs


def main(argv=None) -> int:
    args = parse_args(argv)
    hf_dir = resolve_model_path(args.model)
    multilingual = transformers.AutoConfig.from_pretrained(hf_dir).vocab_size >= 51865
    language = resolve_language(args, multilingual)
    clips = load_clips(args.clips, args.repeat_to)
    if args.long:
        clips = [long_clip(clips, args.long_seconds)]
    print_run_header(args.threads)
    shown = language or ("detected" if multilingual else "en (English-only model)")
    mode = f"beam {args.beam}" if args.beam > 1 else "greedy"
    print(f"model={args.model} clips={len(clips)} language={shown} {mode}", flush=True)
    job = WhisperJob(args.model, hf_dir, [c.samples for c in clips], language, multilingual, beam=args.beam,
                     threads=args.threads, repeat=args.repeat, warmup=not args.no_warmup)
    runs = run_engines(args, job)
    if args.show_texts:
        print_texts(runs, clips)
    print_table(runs, clips)
    return 0


if __name__ == "__main__":
    sys.exit(main())
