"""Transcribe speech with a real Whisper model (default: the bundled Whisper base) and print the transcripts."""
import argparse
import importlib.util
import os
import shutil
import subprocess
import tempfile

from seq2seq_engine import LLM

SAMPLE_CLIPS = ("quick_brown_fox", "hello_world", "counting")


def bundled_samples():
    """English clips shipped by the pytest-audioeval package (installed by scripts/setup_env.sh)."""
    spec = importlib.util.find_spec("pytest_audioeval")
    if spec is None or not spec.submodule_search_locations:
        return []
    folder = os.path.join(list(spec.submodule_search_locations)[0], "samples", "audio", "en")
    return [os.path.join(folder, f"{name}.wav") for name in SAMPLE_CLIPS
            if os.path.exists(os.path.join(folder, f"{name}.wav"))]


def espeak_sample(folder):
    """A sentence spoken by espeak-ng, when it is installed."""
    if shutil.which("espeak-ng") is None:
        return []
    path = os.path.join(folder, "espeak.wav")
    text = "Speech recognition runs on this machine with a paged key value cache."
    subprocess.run(["espeak-ng", "-w", path, text], check=True, capture_output=True)
    return [path]


def reference_text(path):
    txt = os.path.splitext(path)[0] + ".txt"
    if os.path.exists(txt):
        with open(txt, encoding="utf-8") as handle:
            return handle.read().strip()
    return None


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("audio", nargs="*", help="audio files (default: bundled samples + espeak-ng speech)")
    parser.add_argument("--model", default="whisper-base", help="model dir, CTranslate2 dir or whisper-base/-tiny.en")
    parser.add_argument("--timestamps", action="store_true", help="print timestamped segments")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        paths = args.audio or bundled_samples() + espeak_sample(scratch)
        if not paths:
            parser.error("no audio given and no bundled samples found; run scripts/setup_env.sh first")
        llm = LLM(args.model, kv_cache_space_gb=1.0, swap_space_gb=0.1)
        results = llm.transcribe(paths, timestamps=args.timestamps)
    failed = 0
    for path, result in zip(paths, results):
        print(f"\n{os.path.basename(path)} [{result.language}, {result.duration:.1f} s]")
        if result.error:
            failed += 1
            print(f"  error: {result.error}")
            continue
        print(f"  ours:      {result.text.strip()}")
        reference = reference_text(path)
        if reference:
            print(f"  reference: {reference}")
        for segment in result.segments if args.timestamps else []:
            print(f"  [{segment.start:6.2f} -> {segment.end:6.2f}] {segment.text.strip()}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
