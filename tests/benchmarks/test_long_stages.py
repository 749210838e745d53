"""benchmarks/long_stages.py --quick: every stage row, positive times, our stages inside our end-to-end wall, a
transcript; faster-whisper's columns filled where it is installed (the `bench` extra), else empty with the reason."""
import importlib.util
import json
import os
import re
import subprocess
import sys
from typing import Dict, List

import pytest
from conftest import require_model, require_speech_clips
from markdown_tables import markdown_table

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FASTER_WHISPER = importlib.util.find_spec("faster_whisper") is not None
# each row's label starts with these words, in this order
ROWS = ["container decode + resample", "VAD", "packing", "log-mel features", "encoder", "decoder + the rest",
        "word-timestamp alignment", "srt render", "end-to-end transcribe"]
TIMED_APART = ("decode", "vad", "pack", "features", "encoder")


def stage_table(stdout: str) -> List[Dict[str, str]]:
    return markdown_table(stdout.splitlines(), "stage")


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    require_model("whisper-tiny.en")
    require_speech_clips()
    out = tmp_path_factory.mktemp("long_stages") / "stages.json"
    result = subprocess.run([sys.executable, "-m", "benchmarks.long_stages", "--quick", "--threads", "1",
                             "--out", str(out)], capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "FAILED" not in result.stdout, result.stdout
    return result.stdout, json.loads(out.read_text())


def test_every_stage_row_is_there_with_our_times(quick):
    stdout, _ = quick
    table = stage_table(stdout)
    assert list(table[0]) == ["stage", "ours wall s", "ours CPU s", "ours share", "fw wall s", "fw CPU s",
                              "fw share", "bound"]
    assert len(table) == len(ROWS) and all(r["stage"].startswith(prefix) for r, prefix in zip(table, ROWS)), table
    for row in table:
        if row["stage"].startswith("word-timestamp"):   # not asked in --quick
            assert row["ours wall s"] == row["ours CPU s"] == "off"
            continue
        assert float(row["ours wall s"]) >= 0 and float(row["ours CPU s"]) >= 0 and row["ours share"].endswith("%")
    assert table[-1]["ours share"] == "100.0%" and float(table[-1]["ours wall s"]) > 0
    assert "GFLOP/window" in next(r for r in table if r["stage"] == "encoder")["bound"]
    assert re.search(r"^date: \d{4}-\d\d-\d\d \d\d:\d\d UTC$", stdout, re.M) and "command: " in stdout
    assert "load average" in stdout and ", cpu " in stdout


def test_our_stages_fit_in_our_end_to_end_wall_and_the_text_is_there(quick):
    _, report = quick
    (run,) = report["runs"]["ours"]   # one round
    stages = run["stages"]
    assert all(stages[key][0] > 0 and stages[key][1] >= 0 for key in TIMED_APART + ("srt",)), stages
    e2e = stages["e2e"][0]
    apart = sum(stages[key][0] for key in TIMED_APART)
    assert 0 < apart < e2e and stages["decoder"][0] == pytest.approx(e2e - apart)
    assert stages["encoder"][1] > 0 and stages["e2e"][1] > 0 and stages["words"] is None
    info = run["info"]
    assert info["windows"] >= 1 and 20 < info["speech_s"] < 70 and len(info["text"].split()) > 20
    assert report["args"]["minutes"] == 1.0 and report["args"]["model"] == "whisper-tiny.en"


def test_faster_whisper_columns_are_filled_or_say_why_not(quick):
    stdout, report = quick
    table = stage_table(stdout)
    if not FASTER_WHISPER:
        assert "fw columns empty: faster-whisper is not installed (the `bench` extra" in stdout
        assert all(row["fw wall s"] == "" for row in table) and report["medians"].get("fw") is None
        return
    assert "fw columns empty" not in stdout
    (run,) = report["runs"]["fw"]
    assert all(run["stages"][key][0] > 0 for key in TIMED_APART + ("e2e",)) and run["info"]["text"]
    assert float(table[-1]["fw wall s"]) > 0 and table[-1]["fw share"] == "100.0%"
