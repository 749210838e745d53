"""Live transcription under load: N concurrent live streams of real speech at a fixed pace (1x: 100 ms chunks every
100 ms) through `/v1/realtime?intent=transcription` with server VAD, against faster-whisper on the same CTranslate2
weights and the same VAD turns, one `WhisperModel.transcribe` per turn per stream from a thread pool.

Per spoken turn: latency from the end of its speech (in the sent audio) to its transcript's arrival, the delay of
the first text after its speech starts, and WER; per run the CPU time of the server process (of the peer's
process). Reports p50/p95 per N and the largest N each engine sustains with p95 latency <= --target-p95.

    .venv/bin/python -m benchmarks.realtime_load --streams 1,2,4,8 --seconds 60 --out realtime.json
    .venv/bin/python -m benchmarks.realtime_load --quick
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
from typing import Any, Dict, List, Optional

import seq2seq_engine  # noqa: F401,I001 - first: its OpenMP defaults must precede torch

# isort: split
from benchmarks.lib import long_audio
from benchmarks.lib.common import environment_line
from benchmarks.lib.launch import script_argv
from benchmarks.lib.load_servers import start_server
from benchmarks.lib.realtime_clients import items_of, run_ours
from benchmarks.lib.realtime_peer import PeerJob, run_peer_isolated
from benchmarks.lib.realtime_streams import build_streams, score_stream, summarize, vad_turns
from seq2seq_engine.model_loader.resolver import resolve_model_path
from seq2seq_engine.transcription.live import TurnDetection


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="whisper-base", help="a packaged Whisper name (resolver.SHORT_NAMES)")
    parser.add_argument("--quantization", default="int8", choices=["int8", "none"],
                        help="ours: int8 Linear layers (the peer runs compute_type int8 on the same weights)")
    parser.add_argument("--streams", default="1,2,4", help="comma-separated numbers of concurrent streams")
    parser.add_argument("--seconds", type=float, default=60.0, help="length of each stream")
    parser.add_argument("--max-turns", type=int, default=None, help="at most this many turns per stream")
    parser.add_argument("--pace", type=float, default=1.0, help="audio seconds sent per wall second")
    parser.add_argument("--chunk-ms", type=int, default=100)
    parser.add_argument("--threshold", type=float, default=0.5, help="server VAD threshold")
    parser.add_argument("--silence-ms", type=int, default=500, help="server VAD silence_duration_ms")
    parser.add_argument("--prefix-padding-ms", type=int, default=300)
    parser.add_argument("--threads", type=int, default=None,
                        help="the server's OMP_NUM_THREADS and the peer's cpu_threads (default: one per core)")
    parser.add_argument("--peer-workers", type=int, default=1, help="faster-whisper num_workers")
    parser.add_argument("--engines", default="ours,fw", help="ours and/or fw")
    parser.add_argument("--target-p95", type=float, default=1.5, help="seconds: the p95 latency a sustained N keeps")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-espeak", action="store_true", help="only the pytest-audioeval clips")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: whisper-tiny.en, one stream of one short turn, clips only")
    parser.add_argument("--out", default=None, help="write every turn and summary as JSON here")
    args = parser.parse_args(argv)
    if args.quick:
        args.model, args.streams, args.max_turns, args.no_espeak = "whisper-tiny.en", "1", 1, True
    args.stream_counts = sorted({int(n) for n in args.streams.split(",")})
    if not args.stream_counts or args.stream_counts[0] < 1:
        parser.error(f"--streams must be positive integers, got {args.streams!r}")
    if not set(args.engines.split(",")) <= {"ours", "fw"} or not args.engines:
        parser.error(f"--engines must be ours and/or fw, got {args.engines!r}")
    if not 0.1 <= args.pace <= 100:
        parser.error(f"--pace must be in [0.1, 100], got {args.pace}")
    return args


def detection_of(args: argparse.Namespace) -> TurnDetection:
    return TurnDetection(args.threshold, args.prefix_padding_ms, args.silence_ms)


def print_header(args: argparse.Namespace, recordings: List[long_audio.Recording]) -> Dict[str, Any]:
    threads = args.threads or os.cpu_count() or 1
    line = environment_line(threads)
    for package in ("faster_whisper", "websockets"):
        if importlib.util.find_spec(package) is not None:
            line += f", {package.replace('_', '-')} {__import__(package).__version__}"
    speech = sum(e - s for r in recordings for s, e in r.speech_spans)
    turns = sum(len(r.speech_spans) for r in recordings)
    lines = [f"command: {' '.join([os.path.basename(sys.executable)] + script_argv())}", line,
             f"model {args.model} ({'int8' if args.quantization == 'int8' else 'float32'}); streams "
             f"{args.streams} of {sum(r.duration for r in recordings) / len(recordings):.1f} s on average, "
             f"{turns} turns, {speech:.1f} s of speech in the {len(recordings)} streams; pace {args.pace}x, "
             f"{args.chunk_ms} ms chunks; server VAD threshold {args.threshold}, silence {args.silence_ms} ms, "
             f"prefix padding {args.prefix_padding_ms} ms"]
    if not args.no_espeak and not long_audio.have_espeak():
        lines.append("NOTE: espeak-ng is not installed: the streams hold only the pytest-audioeval clips")
    print("\n".join(lines), flush=True)
    return {"lines": lines}


def run_server_side(args: argparse.Namespace, recordings: List[long_audio.Recording]) -> Dict[int, Dict[str, Any]]:
    """One `serve` child for every N: an untimed warm-up stream, then the first N streams at once per N."""
    flags = ["--kv-cache-space-gb", "1.0", "--swap-space-gb", "0.1",
             "--max-realtime-sessions", str(max(64, args.stream_counts[-1]))]
    if args.quantization == "int8":
        flags += ["--quantization", "int8"]
    server = start_server({args.model: resolve_model_path(args.model)}, flags, args.threads)
    detection = {"threshold": args.threshold, "prefix_padding_ms": args.prefix_padding_ms,
                 "silence_duration_ms": args.silence_ms}
    chunk_s = args.chunk_ms / 1000
    runs = {}
    try:
        warmup = build_streams(1, 0, args.seed + 1000, max_turns=1, espeak=False)
        run_ours(server.url, args.model, warmup, chunk_s, 4.0, detection)
        for count in args.stream_counts:
            cpu = server.cpu_seconds()
            events = run_ours(server.url, args.model, recordings[:count], chunk_s, args.pace, detection)
            cpu = server.cpu_seconds() - cpu
            parsed = [items_of(stream_events) for stream_events in events]
            runs[count] = {"items": [items for items, _ in parsed], "cpu": cpu,
                           "errors": [error for _, errors in parsed for error in errors]}
    finally:
        server.stop()
    return runs


def run_peer_side(args: argparse.Namespace, recordings: List[long_audio.Recording]) -> Dict[int, Dict[str, Any]]:
    chunk_s = args.chunk_ms / 1000
    detection = detection_of(args)
    turns = [vad_turns(recording, chunk_s, detection) for recording in recordings]
    warmup = build_streams(1, 0, args.seed + 1000, max_turns=1, espeak=False)[0].samples
    job = PeerJob(args.model, resolve_model_path(args.model), turns, args.stream_counts, chunk_s, args.pace,
                  args.threads or os.cpu_count() or 1, args.peer_workers, warmup,
                  "int8" if args.quantization == "int8" else "float32")
    runs = run_peer_isolated(job)
    for run in runs.values():
        run["errors"] = []
    return runs


def score(runs: Dict[int, Dict[str, Any]], recordings: List[long_audio.Recording], engine: str,
          pace: float) -> List[Dict[str, Any]]:
    results = []
    for count, run in runs.items():
        rows, stray = [], 0
        for recording, items in zip(recordings[:count], run["items"]):
            stream_rows, stream_stray = score_stream(recording, items, pace)
            rows += stream_rows
            stray += stream_stray
        audio = sum(r.duration for r in recordings[:count]) / pace
        summary = dict(summarize(rows, stray), cpu_s=run["cpu"], cpu_per_audio_s=run["cpu"] / audio,
                       errors=len(run["errors"]))
        results.append({"engine": engine, "streams": count, "summary": summary, "turns": rows,
                        "errors": run["errors"][:5]})
    return results


def _pair(a: Optional[float], b: Optional[float]) -> str:
    return " / ".join("-" if v is None else f"{v:.3f}" for v in (a, b))


def sustained(results: List[Dict[str, Any]], engine: str, target: float) -> int:
    """The largest N whose p95 latency is <= target with every turn transcribed and no error (0: none)."""
    ok = [r["streams"] for r in results if r["engine"] == engine and r["summary"]["missed"] == 0
          and not r["summary"]["errors"] and r["summary"]["latency_p95"] is not None
          and r["summary"]["latency_p95"] <= target]
    return max(ok, default=0)


def report(results: List[Dict[str, Any]], args: argparse.Namespace) -> Dict[str, Any]:
    print("| engine | streams | turns | missed | latency p50 / p95 s | first text p50 / p95 s | WER | CPU s "
          "| CPU s per audio s | errors |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        s = r["summary"]
        print(f"| {r['engine']} | {r['streams']} | {s['turns']} | {s['missed']} "
              f"| {_pair(s['latency_p50'], s['latency_p95'])} | {_pair(s['first_text_p50'], s['first_text_p95'])} "
              f"| {s['wer']:.3f} | {s['cpu_s']:.1f} | {s['cpu_per_audio_s']:.3f} | {s['errors']} |")
        for error in r["errors"]:
            print(f"error ({r['engine']}, {r['streams']} streams): {error}")
    engines = sorted({r["engine"] for r in results}, key=["ours", "fw"].index)
    best = {engine: sustained(results, engine, args.target_p95) for engine in engines}
    line = ", ".join(f"{engine} {n}" for engine, n in best.items())
    if len(best) == 2:
        ratio = best["ours"] / best["fw"] if best["fw"] else None
        line += "; ratio ours / fw = " + ("-" if ratio is None else f"{ratio:.2f}")
        best["ratio"] = ratio
    tried = ",".join(str(n) for n in args.stream_counts)
    print(f"largest N (of {tried}) with p95 latency <= {args.target_p95} s: {line}", flush=True)
    return best


def main(argv=None) -> int:
    args = parse_args(argv)
    engines = args.engines.split(",")
    if "fw" in engines and importlib.util.find_spec("faster_whisper") is None:
        print("NOTE: faster-whisper is not installed: the peer is skipped")
        engines.remove("fw")
    recordings = build_streams(args.stream_counts[-1], args.seconds, args.seed, args.max_turns,
                               espeak=not args.no_espeak)
    header = print_header(args, recordings)
    results: List[Dict[str, Any]] = []
    if "ours" in engines:
        results += score(run_server_side(args, recordings), recordings, "ours", args.pace)
    if "fw" in engines:
        results += score(run_peer_side(args, recordings), recordings, "fw", args.pace)
    best = report(results, args)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as handle:
            json.dump({"header": header, "args": vars(args), "runs": results,
                       "sustained": best}, handle, indent=1)
    failed = any(r["summary"]["errors"] for r in results)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
