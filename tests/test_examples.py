"""README's main job: examples/transcribe.py transcribes a bundled clip with the real Whisper base model."""
import importlib.util
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _clip(name):
    spec = importlib.util.find_spec("pytest_audioeval")
    assert spec is not None, "pytest-audioeval is installed by scripts/setup_env.sh"
    return os.path.join(list(spec.submodule_search_locations)[0], "samples", "audio", "en", f"{name}.wav")


def test_transcribe_example_prints_the_spoken_words():
    result = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "transcribe.py"), _clip("hello_world"),
                             _clip("quick_brown_fox")], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "ours:      Hello world." in result.stdout
    assert "ours:      The quick brown fox jumps over the lazy dog." in result.stdout
