"""benchmarks/gpu_throughput.py --tiny on the CPU: the script runs both workloads, writes its JSON and table, and at
float32 this engine and HF `generate` produce the same forced-length tokens on the same random weights."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_tiny_cpu_run_writes_json_and_table(tmp_path):
    out = tmp_path / "gpu_throughput.json"
    result = subprocess.run([sys.executable, "-m", "benchmarks.gpu_throughput", "--tiny",
                             "--device", "cpu", "--rounds", "2", "--out", str(out)],
                            capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads(out.read_text())
    assert (report["device"], report["dtype"]) == ("cpu", "float32")
    whisper, bart = report["workloads"]["whisper"], report["workloads"]["bart"]
    runs = list(whisper["batches"].values()) + [bart["result"]]
    assert list(whisper["batches"]) == ["2", "3"] and len(runs) == 3
    for run in runs:
        for engine in ("ours", "hf"):
            assert len(run[engine]["rounds"]) == 2 and all(t > 0 for t in run[engine]["rounds"])
            assert run[engine]["errors"] == []
        assert run["speed_ratio"] > 0
        assert run["agreement"] == {"identical": 1.0, "common_prefix": 1.0}
    assert whisper["batches"]["3"]["ours"]["rtfx"] > 0 and bart["result"]["ours"]["tokens_per_s"] > 0
    table = [line for line in result.stdout.splitlines() if line.startswith("| whisper |") or
             line.startswith("| bart |")]
    assert len(table) == 6, result.stdout


def test_every_run_of_ours_runs_its_encoders_again(tmp_path):
    """A round after the warm-up on the same inputs reads no cached encoder output (the encoder cache would skip the
    encoders and inflate our speed)."""
    from benchmarks.lib import gpu_workloads as gw
    args = gw.tiny_cpu_args(max_batch=4, bart_docs=3, whisper_new_tokens=2, bart_new_tokens=2, bart_min_len=8,
                            bart_max_len=16)
    whisper = gw.whisper_setup(args, str(tmp_path / "whisper"))
    features = gw.whisper_features(args, 2)
    documents = gw.bart_documents(args)
    bart = gw.bart_setup(args, str(tmp_path / "bart"), documents)
    for llm, run, inputs in ((whisper.ours, gw.whisper_ours, features), (bart.ours, gw.bart_ours, documents)):
        runner = llm.llm_engine.model_runner
        first = run(llm, inputs, 2)
        before = runner.num_encoder_runs
        assert run(llm, inputs, 2) == first and runner.num_encoder_runs - before == len(inputs)


def test_tiny_cpu_run_against_the_ctranslate2_peer(tmp_path):
    """--engines ours,ct2: the same random Whisper converted to CTranslate2 (faster-whisper's engine) runs the same
    windows; at float32 its forced-length greedy tokens are ours, and the table has its rows."""
    pytest.importorskip("ctranslate2")
    out = tmp_path / "gpu_throughput.json"
    result = subprocess.run([sys.executable, "-m", "benchmarks.gpu_throughput", "--tiny", "--device", "cpu",
                             "--rounds", "1", "--workloads", "whisper", "--engines", "ours,ct2", "--out", str(out)],
                            capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    whisper = json.loads(out.read_text())["workloads"]["whisper"]
    assert whisper["ct2"].startswith("ctranslate2 ") and "float32 on cpu" in whisper["ct2"]
    for run in whisper["batches"].values():
        assert set(run) >= {"ours", "ct2"} and "hf" not in run
        assert run["ct2"]["errors"] == [] and run["ct2"]["speed_ratio"] > 0
        assert run["ct2"]["agreement"] == {"identical": 1.0, "common_prefix": 1.0}
    assert len([line for line in result.stdout.splitlines() if line.startswith("| whisper |")]) == 4
