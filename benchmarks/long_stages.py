"""Where a long recording's transcription time goes: per stage wall and CPU time, this engine vs faster-whisper.

    .venv/bin/python -m benchmarks.long_stages --rounds 3                        # whisper-base int8, 30 min, beam 5
    .venv/bin/python -m benchmarks.long_stages --rounds 3 --compute float32 --word-timestamps --out stages.json
    .venv/bin/python -m benchmarks.long_stages --format mp3                      # a 44.1 kHz stereo MP3 to decode
    .venv/bin/python -m benchmarks.long_stages --quick                           # smoke run: tiny.en, ~1 min, 1 round
"""
from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import shutil
import sys
import tempfile
from typing import Any, Dict, List, Optional

import seq2seq_engine  # noqa: F401,I001 - first: its OpenMP defaults must precede torch

# isort: split
import transformers

from benchmarks.lib import long_audio
from benchmarks.lib.common import EngineRun, environment_line, try_isolated
from benchmarks.lib.launch import script_argv
from benchmarks.lib.long_stages_common import StageJob, encoder_gflop, write_recording
from benchmarks.lib.long_stages_fw import run_fw_stages
from benchmarks.lib.long_stages_ours import run_ours_stages
from benchmarks.lib.long_stages_report import medians, print_report
from seq2seq_engine.model_loader.resolver import resolve_model_path

FW_MISSING = "faster-whisper is not installed (the `bench` extra: pip install -c constraints-cpu.txt -e \".[bench]\")"


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=["whisper-base", "whisper-tiny.en"], default=None,
                        help="default: whisper-base (whisper-tiny.en with --quick)")
    parser.add_argument("--minutes", type=float, default=None,
                        help="length of the recording (default 30; 1 with --quick)")
    parser.add_argument("--compute", choices=["int8", "float32"], default="int8",
                        help="ours: quantization int8 (float32 activations) or float32; faster-whisper: compute_type")
    parser.add_argument("--beam-width", type=int, default=5)
    parser.add_argument("--word-timestamps", action="store_true",
                        help="time the words too (the alignment row: with - without)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads and faster-whisper cpu_threads")
    parser.add_argument("--batch-size", type=int, default=8, help="faster-whisper's batch_size")
    parser.add_argument("--max-in-flight", type=int, default=None,
                        help="ours: engine requests (windows) at once (default: the engine's, by its KV budget)")
    parser.add_argument("--rounds", type=int, default=None,
                        help="runs per engine, interleaved (ours, fw, ours, ...), each in a fresh child process; "
                             "medians reported (default 3; 1 with --quick)")
    parser.add_argument("--engines", default="ours,fw", help="comma list of ours, fw")
    parser.add_argument("--format", choices=["wav", "mp3"], default="wav",
                        help="wav: 16 kHz mono PCM (as long_transcribe.py writes); mp3: stereo at --sample-rate")
    parser.add_argument("--sample-rate", type=int, default=None,
                        help="of the file (default 16000 for wav, 44100 for mp3)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the recording's layout")
    parser.add_argument("--out", default=None, help="write the table, every run and the medians as JSON")
    parser.add_argument("--quick", action="store_true", help="smoke run: whisper-tiny.en, ~1 minute, 1 round")
    args = parser.parse_args(argv)
    args.model = args.model or ("whisper-tiny.en" if args.quick else "whisper-base")
    args.minutes = args.minutes or (1.0 if args.quick else 30.0)
    args.rounds = args.rounds or (1 if args.quick else 3)
    args.sample_rate = args.sample_rate or (44100 if args.format == "mp3" else 16000)
    return args


def build_audio(args: argparse.Namespace, folder: str) -> tuple:
    """The recording (lib/long_audio.py, one of --minutes) written as --format, and a 10 s warm-up piece of it."""
    (recording,) = long_audio.build_recordings(1, args.minutes * 60, args.seed)
    path = write_recording(recording.samples, folder, "long", args.format, args.sample_rate)
    warmup = write_recording(recording.samples[:10 * 16000], folder, "warmup", args.format, args.sample_rate)
    return recording, path, warmup


def print_header(args: argparse.Namespace, recording: long_audio.Recording, path: str) -> str:
    line = environment_line(args.threads)
    if importlib.util.find_spec("faster_whisper") is not None:
        import faster_whisper
        line += f", faster-whisper {faster_whisper.__version__}"
    print(f"date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC")
    print(f"command: {' '.join([os.path.basename(sys.executable)] + script_argv())}")
    print(line)
    if not long_audio.have_espeak():
        print("NOTE: espeak-ng is not installed: the recording holds only the pytest-audioeval clips, repeated")
    speech = sum(end - start for start, end in recording.speech_spans)
    print(f"recording: {recording.duration:.1f} s, speech {speech:.1f} s in {len(recording.speech_spans)} "
          f"utterances; file {args.format} {args.sample_rate} Hz, {os.path.getsize(path) / 2**20:.1f} MiB")
    print(f"model={args.model} compute={args.compute} beam={args.beam_width} word_timestamps={args.word_timestamps}; "
          f"ours: llm.transcribe(vad_filter=True, max_in_flight={args.max_in_flight}, its other defaults); "
          f"fw: BatchedInferencePipeline.transcribe("
          f"batch_size={args.batch_size}, vad_filter=True)", flush=True)
    return line


def engine_specs(args: argparse.Namespace, job: StageJob) -> tuple:
    """[(label, target)] of the engines to run, and why fw is left out (None when it runs)."""
    engines = args.engines.split(",")
    specs = [("ours", run_ours_stages)] if "ours" in engines else []
    reason = None
    if "fw" not in engines:
        reason = "not asked (--engines)"
    elif importlib.util.find_spec("faster_whisper") is None:
        reason = FW_MISSING
    else:
        specs.append(("fw", run_fw_stages))
    return specs, reason


def run_all(specs: list, job: StageJob, rounds: int, failures: List[str]) -> Dict[str, List[EngineRun]]:
    """Every engine once per round, interleaved, each run in a fresh child; an engine that fails is not rerun."""
    runs: Dict[str, List[EngineRun]] = {name: [] for name, _ in specs}
    failed = set()
    for index in range(rounds):
        for name, target in specs:
            if name in failed:
                continue
            suffix = f" (round {index + 1}/{rounds})" if rounds > 1 else ""
            run = try_isolated(failures, f"{name} {job.compute}{suffix}", target, job)
            if run is None:
                failed.add(name)
            else:
                runs[name].append(run)
    return runs


def write_json(path: str, args: argparse.Namespace, environment: str, runs: Dict[str, List[EngineRun]],
               summaries: Dict[str, Any], rows: List[List[str]]) -> None:
    report = {"environment": environment, "command": script_argv(), "args": vars(args), "table": rows,
              "medians": summaries,
              "runs": {name: [dict(r.outputs[0], peak_rss_mib=r.peak_rss_mib) for r in engine_runs]
                       for name, engine_runs in runs.items()}}
    with open(path, "w", encoding="utf-8") as out:
        json.dump(report, out, indent=1)


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    hf_dir = resolve_model_path(args.model)
    config = transformers.AutoConfig.from_pretrained(hf_dir)
    folder = tempfile.mkdtemp(prefix="bench-long-stages-")
    failures: List[str] = []
    try:
        recording, path, warmup = build_audio(args, folder)
        environment = print_header(args, recording, path)
        job = StageJob(args.model, hf_dir, path, warmup, "en" if config.vocab_size >= 51865 else None, args.compute,
                       args.beam_width, args.word_timestamps, args.threads, args.batch_size, args.max_in_flight)
        specs, fw_reason = engine_specs(args, job)
        runs = run_all(specs, job, args.rounds, failures)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    for failure in failures:
        print(f"FAILED: {failure}")
    if "fw" in runs and not runs["fw"]:
        fw_reason = "its run failed (see above)"
    summaries = {name: medians(engine_runs) if engine_runs else None for name, engine_runs in runs.items()}
    rows = print_report(summaries, fw_reason, encoder_gflop(config), args.word_timestamps, recording.duration)
    if args.out:
        write_json(args.out, args, environment, runs, summaries, rows)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
