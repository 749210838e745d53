"""benchmarks/cold_start.py --quick: the command line and faster-whisper each end to end in fresh processes, the wall
times table with the peer's ratio, and our in-process split."""
import importlib.util
import os
import subprocess
import sys

from conftest import require_model, require_speech_clips
from markdown_tables import markdown_table

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FASTER_WHISPER = importlib.util.find_spec("faster_whisper") is not None


def test_cold_start_quick():
    require_model("whisper-tiny.en")
    require_speech_clips()
    result = subprocess.run([sys.executable, "-m", "benchmarks.cold_start", "--quick",
                             "--threads", "1"], capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert "load average" in result.stdout and ", cpu " in result.stdout   # the machine header
    walls = markdown_table(lines, "engine")
    assert [(r["engine"], r["dtype"], r["beam"]) for r in walls] == (
        [("ours", "float32", "1")] + ([("fw", "float32", "1")] if FASTER_WHISPER else []))
    assert all(float(r["end to end s (best)"]) > 0 for r in walls)
    assert walls[0]["peer / ours"] == "" and all(r["peer / ours"].endswith("x") for r in walls[1:])
    split = markdown_table(lines, "ours dtype")
    assert len(split) == 1 and all(float(split[0][f"{phase} s"]) > 0
                                   for phase in ("python start", "imports", "load", "transcribe"))
