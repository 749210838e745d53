"""benchmarks/lora_throughput.py end to end on its smallest setting: every engine runs, the report's ratios and the
adapter's load time and memory are printed, and ours with adapters gives PEFT's tokens."""
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_lora_throughput_quick_bart_reports_every_engine_and_agrees_with_peft():
    result = subprocess.run([sys.executable, "-m", "benchmarks.lora_throughput", "--workload", "bart", "--quick",
                             "--threads", "1", "--requests", "4", "--adapters", "2"],
                            capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    stdout = result.stdout
    assert "FAILED" not in stdout, stdout
    assert "### bart: 4 requests over 2 adapters of rank 16" in stdout
    for label in ("ours-base", "ours-lora", "peft-lora", "hf-base"):
        assert re.search(rf"^\| {label} \| [0-9.]+ \|", stdout, re.M), label
    assert re.search(r"adapters / base model throughput: [0-9.]+x", stdout)
    assert "same tokens as PEFT: 100% of requests" in stdout
    assert re.search(r"one adapter: loaded in [0-9.]+ s, [0-9.]+ MiB in host memory, [0-9.]+ MiB of device slots",
                     stdout)
