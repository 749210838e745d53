"""Long-recording transcription: this engine vs faster-whisper on built recordings (speed, WER, words in gaps, memory).

    .venv/bin/python -m benchmarks.long_transcribe --rounds 3                   # whisper-base, 3 recordings of ~2 min
    .venv/bin/python -m benchmarks.long_transcribe --vad-filter on --beam-width 5 --rounds 3
    .venv/bin/python -m benchmarks.long_transcribe --quick                      # smoke run: tiny.en, one ~20 s file
"""
from __future__ import annotations

import argparse
import datetime
import importlib.util
import os
import shutil
import sys
import tempfile
from typing import Any, Dict, List, Optional

import seq2seq_engine  # noqa: F401,I001 - first: its OpenMP defaults must precede torch

# isort: split
import transformers

from benchmarks.lib import long_audio
from benchmarks.lib.common import (EngineRun, EngineSpec, add_timing_args, environment_line, print_markdown,
                                   ratio_cells, ratio_columns, run_rounds)
from benchmarks.lib.launch import script_argv
from benchmarks.lib.long_engines import LongJob, accepted_options, int8_supported, run_fw, run_ours
from benchmarks.lib.wer import corpus_wer, inserted_runs, normalize
from seq2seq_engine.model_loader.resolver import resolve_model_path

ON_OFF = {"on": True, "off": False}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=["whisper-base", "whisper-tiny.en"], default=None,
                        help="default: whisper-base (whisper-tiny.en with --quick)")
    parser.add_argument("--recordings", type=int, default=3, help="how many recordings to build")
    parser.add_argument("--seconds", type=float, default=120.0, help="length of each recording (about)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the recordings' layouts")
    parser.add_argument("--audio-dir", default=None, help="where to write the recordings (default: a temp folder)")
    parser.add_argument("--engines", default="ours,fw-seq,fw-batched", help="comma list of ours, fw-seq, fw-batched")
    parser.add_argument("--ours-dtypes", default=None,
                        help="default float32,bfloat16,int8 (float32 with --quick); int8 runs only if the engine "
                             "takes `quantization` (else skipped with a note)")
    parser.add_argument("--fw-compute-types", default="float32,int8")
    parser.add_argument("--batch-size", type=int, default=8, help="fw-batched batch size")
    parser.add_argument("--threads", type=int, default=2, help="torch threads and faster-whisper cpu_threads")
    add_timing_args(parser)
    # Our transcription options: each passed only if our transcribe() accepts it (the header says which were).
    parser.add_argument("--vad-filter", choices=sorted(ON_OFF), default=None)
    parser.add_argument("--temperature", default=None, help="one value, or a comma list (fallback temperatures)")
    parser.add_argument("--beam-width", type=int, default=None)
    parser.add_argument("--timestamps", action="store_true",
                        help="ours decodes with timestamp tokens (segments per utterance); default: without, as "
                             "fw-batched decodes, one segment per window")
    parser.add_argument("--condition-on-previous-text", choices=sorted(ON_OFF), default=None)
    parser.add_argument("--gap-margin", type=float, default=0.5,
                        help="seconds trimmed off each side of a non-speech stretch next to speech")
    parser.add_argument("--no-warmup", action="store_true", help="skip the untimed warm-up on a 10 s file")
    parser.add_argument("--show-texts", action="store_true", help="print every engine's segments")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: whisper-tiny.en unless --model is given, one ~20 s recording, ours float32")
    args = parser.parse_args(argv)
    if args.quick:
        args.recordings, args.seconds = 1, 20.0
    args.ours_dtypes = args.ours_dtypes or ("float32" if args.quick else "float32,bfloat16,int8")
    args.model = args.model or ("whisper-tiny.en" if args.quick else "whisper-base")
    return args


def requested_options(args: argparse.Namespace) -> Dict[str, Any]:
    options: Dict[str, Any] = {}
    if args.vad_filter is not None:
        options["vad_filter"] = ON_OFF[args.vad_filter]
    if args.temperature is not None:
        values = [float(t) for t in args.temperature.split(",")]
        options["temperature"] = values[0] if len(values) == 1 else tuple(values)
    if args.beam_width is not None:
        options["beam_width"] = args.beam_width
    if args.condition_on_previous_text is not None:
        options["condition_on_previous_text"] = ON_OFF[args.condition_on_previous_text]
    if args.timestamps:
        options["timestamps"] = True
    return options


def build_audio(args: argparse.Namespace) -> tuple:
    """Write the recordings and a 10 s warm-up file (to --audio-dir, or a temp folder removed at the end);
    (recordings, their paths, the warm-up path)."""
    folder = args.audio_dir or tempfile.mkdtemp(prefix="bench-long-audio-")
    recordings = long_audio.build_recordings(args.recordings, args.seconds, args.seed)
    paths = [long_audio.write(r, folder) for r in recordings]
    warmup = long_audio.Recording("warmup", recordings[0].samples[:10 * 16000], [])
    return recordings, paths, None if args.no_warmup else long_audio.write(warmup, folder)


def engine_specs(args: argparse.Namespace, job: LongJob) -> List[EngineSpec]:
    engines = args.engines.split(",")
    specs: List[EngineSpec] = []
    for dtype in args.ours_dtypes.split(",") if "ours" in engines else []:
        if dtype == "int8" and not int8_supported():
            print("  ours int8: the engine has no `quantization` argument yet, skipped", flush=True)
            continue
        specs.append(EngineSpec(f"ours {dtype}", run_ours, (job, dtype)))
    fw_modes = [m for m in ("fw-seq", "fw-batched") if m in engines]
    if fw_modes and importlib.util.find_spec("faster_whisper") is None:
        print("  fw-seq, fw-batched: faster-whisper is not installed (the `bench` extra), skipped", flush=True)
        fw_modes = []
    for mode in fw_modes:
        for compute_type in args.fw_compute_types.split(","):
            specs.append(EngineSpec(f"{mode} {compute_type}", run_fw, (job, mode, compute_type)))
    return specs


def print_header(args: argparse.Namespace, recordings: List[long_audio.Recording], applied: Dict[str, Any],
                 ignored: List[str]) -> None:
    print(f"date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC")
    print(f"command: {' '.join([os.path.basename(sys.executable)] + script_argv())}")
    line = environment_line(args.threads)
    if importlib.util.find_spec("faster_whisper") is not None:
        import faster_whisper
        line += f", faster-whisper {faster_whisper.__version__}"
    print(line)
    if not long_audio.have_espeak():
        print("NOTE: espeak-ng is not installed: the recordings hold only the pytest-audioeval clips, repeated")
    for r in recordings:
        speech = sum(end - start for start, end in r.speech_spans)
        print(f"{r.name}: {r.duration:.1f} s, speech {speech:.1f} s in {len(r.speech_spans)} utterances, "
              f"non-speech counted {sum(e - s for s, e in long_audio.gaps(r.parts, args.gap_margin)):.1f} s")
    shown = ", ".join(f"{k}={v}" for k, v in applied.items()) or "none (its defaults)"
    print(f"model={args.model}; ours: options applied: {shown}"
          + (f"; not accepted by its transcribe(), not applied: {', '.join(ignored)}" if ignored else ""))
    print("faster-whisper: its defaults (beam 5, temperature fallback 0-1, condition_on_previous_text), language en; "
          f"fw-batched: batch_size {args.batch_size}, VAD on, its segments are the VAD chunks (without_timestamps)",
          flush=True)


def count_words(text: str) -> int:
    return len(normalize(text))


def print_table(runs: List[EngineRun], recordings: List[long_audio.Recording], margin: float) -> None:
    audio = sum(r.duration for r in recordings)
    header = (["engine", "dtype", "recordings", "audio s", "wall s", "x realtime", "WER", "non-speech words",
               "non-speech words (time share)", "peak RSS MiB"] + ratio_columns(runs) + ["every run s"])
    rows = []
    for run in runs:
        wer = corpus_wer((r.reference, out["text"]) for r, out in zip(recordings, run.outputs))
        counts = [long_audio.words_in_gaps(out["segments"], r.parts, margin, count_words)
                  for r, out in zip(recordings, run.outputs)]
        rows.append([run.engine, run.dtype, str(len(recordings)), f"{audio:.1f}", f"{run.wall:.2f}",
                     f"{audio / run.wall:.2f}", f"{wer:.3f}", f"{sum(c[1] for c in counts):.1f}",
                     f"{sum(c[0] for c in counts):.1f}", f"{run.peak_rss_mib:.0f}"]
                    + ratio_cells(run, runs) + [" / ".join(f"{w:.2f}" for w in run.walls)])
    print_markdown(header, rows)
    print("(vs <peer>: peer wall s / our wall s, > 1: we are faster; non-speech words: see benchmarks/README.md)")


def print_texts(runs: List[EngineRun], recordings: List[long_audio.Recording]) -> None:
    for i, recording in enumerate(recordings):
        print(f"{recording.name} reference: {recording.reference!r}")
        for run in runs:
            print(f"  {run.label}:")
            for start, end, text in run.outputs[i]["segments"]:
                print(f"    [{start:7.2f} - {end:7.2f}] {text.strip()}")
            runs_inserted = inserted_runs(recording.reference, run.outputs[i]["text"])
            print(f"    words inserted (aligned to the reference): {'; '.join(runs_inserted) or 'none'}")


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    hf_dir = resolve_model_path(args.model)
    multilingual = transformers.AutoConfig.from_pretrained(hf_dir).vocab_size >= 51865
    recordings, paths, warmup = build_audio(args)
    applied, ignored = accepted_options(requested_options(args))
    print_header(args, recordings, applied, ignored)
    job = LongJob(args.model, hf_dir, paths, warmup, [r.duration for r in recordings],
                  "en" if multilingual else None, applied, args.threads, args.repeat, args.batch_size)
    failures: List[str] = []
    try:
        runs = run_rounds(engine_specs(args, job), args.rounds, failures)
    finally:
        if not args.audio_dir:
            shutil.rmtree(os.path.dirname(paths[0]), ignore_errors=True)
    for failure in failures:
        print(f"FAILED: {failure}")
    if args.show_texts:
        print_texts(runs, recordings)
    print_table(runs, recordings, args.gap_margin)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
