"""benchmarks/host_overhead.py at a few requests: both workloads run with and without asynchronous scheduling, every
request gets its tokens (the same both ways), and the table splits each step into model compute and host time, the
host's by phase."""
import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_small_run_prints_the_table_and_the_tokens(tmp_path):
    tokens_out = tmp_path / "tokens.json"
    result = subprocess.run([sys.executable, "-m", "benchmarks.host_overhead", "--rounds", "1",
                             "--whisper-windows", "3", "--whisper-new-tokens", "4", "--bart-docs", "5",
                             "--bart-new-tokens", "3", "--tokens-out", str(tokens_out), "--compare-async"],
                            capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    names = ["whisper 3x4", "whisper 3x4, async", "bart 5x3", "bart 5x3, async"]
    label = r"^\| (whisper 3x4(?:, async)?|bart 5x3(?:, async)?) \| "
    rows = re.findall(label + r"([0-9.]+) \| (\d+) \| ([0-9.]+) \| (-?[0-9.]+) \| (-?[0-9.]+) \| (\d+) \|$",
                      result.stdout, re.M)
    assert [row[0] for row in rows] == names, result.stdout
    for name, wall, steps, compute, _, _, tokens in rows:
        assert float(wall) > 0 and int(steps) >= 3 and float(compute) > 0
        assert int(tokens) == (3 * 4 if name.startswith("whisper") else 5 * 3)
    phases = re.findall(label + r"([0-9.]+) \| ([0-9.]+) \| ([0-9.]+) \|$", result.stdout, re.M)
    assert [row[0] for row in phases] == names, result.stdout   # schedule, inputs, outputs
    assert all(float(ms) > 0 for row in phases for ms in row[1:])
    tokens = json.loads(tokens_out.read_text())
    assert [len(t) for t in tokens["whisper 3x4"]] == [4] * 3 and [len(t) for t in tokens["bart 5x3"]] == [3] * 5
    assert tokens["whisper 3x4, async"] == tokens["whisper 3x4"] and tokens["bart 5x3, async"] == tokens["bart 5x3"]
