"""Cold start: `seq2seq-engine transcribe CLIP --model whisper-base --language en` end to end (a fresh process: the
interpreter, the imports, the model load, the transcription) against faster-whisper in a fresh process on the same
CTranslate2 weights, float32 and int8, at equal beam width; plus our in-process split (imports, load, transcribe).

    .venv/bin/python -m benchmarks.cold_start --rounds 3                    # beam 5 (faster-whisper's default)
    .venv/bin/python -m benchmarks.cold_start --beams 5,1 --rounds 3        # beam 5 and greedy
    .venv/bin/python -m benchmarks.cold_start --engines ours,fw,fw-mkl      # also faster-whisper with CT2_USE_MKL=1
    .venv/bin/python -m benchmarks.cold_start --quick                       # smoke run: tiny.en, float32, greedy

The clip is the bundled English clips joined with 0.5 s silences (11.9 s, about jfk.wav's 11 s) unless --clip names
one. One untimed run of every command comes first (it converts and prepares the model, builds the kernels and
writes the bytecode a real install has); then every command runs once per round, interleaved, each in a fresh
process, and the fastest round counts (every time is printed). faster-whisper runs with its defaults but
language="en" (the command's --language en) and cpu_threads=--threads; on AMD CPUs CTranslate2 takes oneDNN for
float32 unless CT2_USE_MKL=1 (the fw-mkl engine).
"""
from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Tuple

import seq2seq_engine  # noqa: F401,I001 - first: its OpenMP defaults must precede torch

# isort: split
import numpy as np
import soundfile

from benchmarks.lib.clips import sample_dir
from benchmarks.lib.common import environment_line, print_markdown
from benchmarks.lib.launch import script_argv
from benchmarks.lib.whisper_engines import ct2_model_dir

CLIP_PARTS = ("quick_brown_fox", "counting", "hello_world", "quick_brown_fox")
PHASES = ("python start", "imports", "load", "transcribe")   # imports: torch, the engine, the command line
FW_CODE = """import json, sys, time
start = time.perf_counter()
from faster_whisper import WhisperModel
imported = time.perf_counter()
model = WhisperModel(sys.argv[1], device="cpu", compute_type=sys.argv[2], cpu_threads=int(sys.argv[3]))
loaded = time.perf_counter()
segments, _ = model.transcribe(sys.argv[4], beam_size=int(sys.argv[5]), language="en")
text = " ".join(segment.text.strip() for segment in segments)
done = time.perf_counter()
print(text)
print(json.dumps({"imports": imported - start, "load": loaded - imported, "transcribe": done - loaded}))
"""
SPLIT_CODE = """import json, sys, time
start = time.perf_counter()
from seq2seq_engine.entrypoints import cli, transcribe_cli
from seq2seq_engine.entrypoints.transcribe_flags import options_from_args
import torch
imported = time.perf_counter()
from seq2seq_engine import LLM
from seq2seq_engine.model_loader.resolver import resolve_model_path
args = cli.build_parser().parse_args(sys.argv[1:])
llm = LLM(resolve_model_path(args.model), **transcribe_cli.engine_kwargs(args))
loaded = time.perf_counter()
result = llm.transcribe([args.audio[0]], options_from_args(args), use_tqdm=False)[0]
done = time.perf_counter()
print(result.text.strip())
print(json.dumps({"imports": imported - start, "load": loaded - imported, "transcribe": done - loaded}))
"""


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, choices=["whisper-base", "whisper-tiny.en"],
                        help="default: whisper-base (whisper-tiny.en with --quick)")
    parser.add_argument("--clip", default=None, help="a WAV file (default: the bundled clips joined, 11.9 s)")
    parser.add_argument("--engines", default="ours,fw", help="comma list of ours, fw, fw-mkl")
    parser.add_argument("--dtypes", default="float32,int8")
    parser.add_argument("--beams", default="5", help="comma list of beam widths (1: greedy)")
    parser.add_argument("--threads", type=int, default=2, help="faster-whisper's cpu_threads (ours: all cores)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--show-texts", action="store_true")
    parser.add_argument("--quick", action="store_true", help="smoke run: tiny.en, float32, greedy, one round")
    args = parser.parse_args(argv)
    if args.quick:
        args.dtypes, args.beams, args.rounds = "float32", "1", 1
    args.model = args.model or ("whisper-tiny.en" if args.quick else "whisper-base")
    if "fw" in args.engines and importlib.util.find_spec("faster_whisper") is None:
        print("faster-whisper is not installed: its rows are skipped (pip install faster-whisper)")
        args.engines = ",".join(engine for engine in args.engines.split(",") if not engine.startswith("fw"))
    return args


def build_clip(folder: str) -> str:
    """The bundled English clips joined with 0.5 s silences, as a 16-bit WAV."""
    pieces = []
    for name in CLIP_PARTS:
        samples, rate = soundfile.read(os.path.join(sample_dir(), "en", f"{name}.wav"), dtype="float32")
        pieces += [samples, np.zeros(rate // 2, np.float32)]
    path = os.path.join(folder, "clip.wav")
    soundfile.write(path, np.concatenate(pieces), rate, subtype="PCM_16")
    return path


def child_env(engine: str) -> Dict[str, str]:
    """A user's environment: bytecode written as an install has it; CT2_USE_MKL=1 only for fw-mkl."""
    env = {key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"}
    env.pop("CT2_USE_MKL", None)
    if engine == "fw-mkl":
        env["CT2_USE_MKL"] = "1"
    return env


def our_arguments(args: argparse.Namespace, clip: str, dtype: str, beam: int) -> List[str]:
    flags = ["transcribe", clip, "--model", args.model, "--language", "en", "--beam-width", str(beam)]
    return flags + (["--quantization", "int8"] if dtype == "int8" else [])


def command(args: argparse.Namespace, engine: str, dtype: str, beam: int, clip: str, ct2_dir: str) -> List[str]:
    """The end-to-end command of one engine."""
    if engine == "ours":
        script = os.path.join(os.path.dirname(sys.executable), "seq2seq-engine")
        launcher = [script] if os.path.exists(script) else [sys.executable, "-m", "seq2seq_engine.entrypoints.cli"]
        return launcher + our_arguments(args, clip, dtype, beam)
    return [sys.executable, "-c", FW_CODE, ct2_dir, dtype, str(args.threads), clip, str(beam)]


def timed(cmd: List[str], env: Dict[str, str]) -> Tuple[float, str]:
    """(wall seconds, stdout) of one fresh process."""
    start = time.perf_counter()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:3])}... exited with {done.returncode}: {done.stderr[-2000:]}")
    return wall, done.stdout


def run_all(args, configs, clip: str, ct2_dir: str) -> Dict[tuple, List[float]]:
    """Every config's end-to-end wall times: one untimed run each, then --rounds interleaved rounds."""
    walls: Dict[tuple, List[float]] = {config: [] for config in configs}
    texts: Dict[tuple, str] = {}
    for round_index in range(args.rounds + 1):
        for config in configs:
            wall, out = timed(command(args, *config, clip, ct2_dir), child_env(config[0]))
            label = "untimed first run" if round_index == 0 else f"round {round_index}/{args.rounds}"
            print(f"{' '.join(map(str, config))}: {wall:.2f} s ({label})", flush=True)
            if round_index:
                walls[config].append(wall)
            texts[config] = out.strip().splitlines()[0] if out.strip() else ""
    if args.show_texts:
        for config, text in texts.items():
            print(f"{' '.join(map(str, config))}: {text}")
    return walls


def wall_row(config: tuple, walls: Dict[tuple, List[float]]) -> List[str]:
    engine, dtype, beam = config
    best = min(walls[config])
    ours = walls.get(("ours", dtype, beam))
    ratio = f"{best / min(ours):.2f}x" if ours and engine != "ours" else ""
    return [engine, dtype, str(beam), f"{best:.2f}", " ".join(f"{wall:.2f}" for wall in walls[config]), ratio]


def our_split(args, clip: str, dtype: str, beam: int) -> List[float]:
    """Seconds of each of PHASES inside one process (each the fastest of --rounds fresh processes); "python start"
    is a bare interpreter's whole run."""
    best: Dict[str, float] = {}
    for _ in range(max(args.rounds, 1)):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], check=True, env=child_env("ours"))
        phases = {"python start": time.perf_counter() - start}
        cmd = [sys.executable, "-c", SPLIT_CODE] + our_arguments(args, clip, dtype, beam)
        _, out = timed(cmd, child_env("ours"))
        phases.update(json.loads(out.strip().splitlines()[-1]))
        best = {key: min(value, best.get(key, value)) for key, value in phases.items()}
    return [best[phase] for phase in PHASES]


def fw_version() -> str:
    try:
        return importlib.metadata.version("faster-whisper")
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def main(argv=None) -> int:
    args = parse_args(argv)
    print(f"argv: {' '.join(script_argv())}")
    print(environment_line(args.threads) + f", faster-whisper {fw_version()}", flush=True)
    engines, dtypes = args.engines.split(","), args.dtypes.split(",")
    beams = [int(beam) for beam in args.beams.split(",")]
    configs = [(engine, dtype, beam) for beam in beams for dtype in dtypes for engine in engines]
    with tempfile.TemporaryDirectory() as folder:
        clip = args.clip or build_clip(folder)
        print(f"clip {clip}: {soundfile.info(clip).duration:.1f} s; CTranslate2 weights "
              f"{ct2_model_dir(args.model)}", flush=True)
        walls = run_all(args, configs, clip, ct2_model_dir(args.model))
        print_markdown(["engine", "dtype", "beam", "end to end s (best)", "every round s", "peer / ours"],
                       [wall_row(config, walls) for config in configs])
        if "ours" in engines:
            split_rows = [[dtype, str(beam)] + [f"{seconds:.2f}" for seconds in our_split(args, clip, dtype, beam)]
                          for dtype in dtypes for beam in beams]
            print()
            print_markdown(["ours dtype", "beam"] + [f"{phase} s" for phase in PHASES], split_rows)
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
