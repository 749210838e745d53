"""The benchmark scripts' --quick modes: each runs in a subprocess, prints its table, and this engine at float32
produces the same tokens (greedy and beam search) or transcripts as HF transformers on the same inputs."""
import importlib.util
import os
import re
import subprocess
import sys
from typing import Dict, List

import pytest
from conftest import require_model, require_speech_clips

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CT2 = importlib.util.find_spec("ctranslate2") is not None
FASTER_WHISPER = importlib.util.find_spec("faster_whisper") is not None


def run_script(name: str, *args: str) -> str:
    """The stdout of `python -m benchmarks.<name> --quick --threads 1 ...`; it must exit 0 and report no failed
    engine."""
    result = subprocess.run([sys.executable, "-m", f"benchmarks.{name}", "--quick", "--threads", "1", *args],
                            capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "FAILED" not in result.stdout, result.stdout
    return result.stdout


def parse_tables(stdout: str) -> List[List[Dict[str, str]]]:
    """Every markdown table in the output, as rows of {column: cell}."""
    tables, lines = [], stdout.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("| engine |") and i + 1 < len(lines) and lines[i + 1].startswith("|---"):
            header = [cell.strip() for cell in line.strip("|").split("|")]
            rows = []
            for row_line in lines[i + 2:]:
                if not row_line.startswith("| "):
                    break
                rows.append(dict(zip(header, (cell.strip() for cell in row_line.strip("|").split("|")))))
            tables.append(rows)
    return tables


def row(table: List[Dict[str, str]], engine: str, dtype: str) -> Dict[str, str]:
    matches = [r for r in table if r["engine"] == engine and r["dtype"] == dtype]
    assert len(matches) == 1, table
    return matches[0]


def check_table(table: List[Dict[str, str]], expected: List[tuple]) -> None:
    """One row per engine run, positive timings and memory, ratios on our rows only."""
    assert [(r["engine"], r["dtype"]) for r in table] == expected
    for r in table:
        assert float(r["wall s"]) > 0 and float(r["process peak RSS MiB"]) >= float(r["RSS after load MiB"]) > 100
    ours_fp32 = row(table, "ours", "float32")
    assert ours_fp32["same as ours-float32"] == "100%"
    assert ours_fp32["vs hf-float32"].endswith("x") and row(table, "hf", "float32")["vs hf-float32"] == ""


def expected_rows(ours_dtypes=("float32", "bfloat16"), peers=(("hf", "float32"),)) -> List[tuple]:
    ct2 = [("ct2", "float32"), ("ct2", "int8")] if CT2 else []
    return [("ours", d) for d in ours_dtypes] + list(peers) + ct2


@pytest.mark.parametrize("workload", ["bart", "smollm2", "marian", "t5"])
def test_throughput_quick_greedy(workload):
    """Every engine on BART; on the other workloads (their own prompts and models) ours and HF at float32."""
    if workload == "smollm2":
        require_model("smollm2-135m")
    every_engine = workload == "bart"
    engines = [] if every_engine else ["--engines", "ours,hf", "--ours-dtypes", "float32"]
    stdout = run_script("throughput", "--workload", workload, *engines)
    (table,) = parse_tables(stdout)
    if every_engine:
        check_table(table, expected_rows())
        if not CT2:
            assert "ctranslate2 is not installed, skipped" in stdout
    else:
        check_table(table, [("ours", "float32"), ("hf", "float32")])
    hf = row(table, "hf", "float32")
    assert (hf["same as ours-float32"], hf["common prefix"]) == ("100%", "100.0%")
    assert "every engine produced exactly the target length for every request" in stdout
    # Every engine generated the same number of tokens (the forced lengths).
    assert len({r["gen tokens"] for r in table}) == 1


def test_throughput_quick_beam_search_bart():
    stdout = run_script("throughput", "--workload", "bart", "--beam", "4", "--engines", "ours,hf",
                        "--ours-dtypes", "float32", "--num-prompts", "4")
    (table,) = parse_tables(stdout)
    assert "### bart (beam 4)" in stdout
    check_table(table, [("ours", "float32"), ("hf", "float32")])
    assert row(table, "hf", "float32")["same as ours-float32"] == "100%"
    assert "every engine produced exactly the target length for every request" in stdout


def test_transcribe_quick_greedy():
    require_model("whisper-tiny.en")
    require_speech_clips()
    stdout = run_script("transcribe", "--ours-dtypes", "float32", "--ct2-dtypes", "int8")
    (table,) = parse_tables(stdout)
    check_table(table, [("ours", "float32"), ("hf", "float32")] + ([("ct2", "int8")] if CT2 else []))
    assert row(table, "hf", "float32")["same as ours-float32"] == "100%"
    assert {r["clips"] for r in table} == {"4"}


def test_long_transcribe_quick_builds_a_recording_and_reports_every_engine():
    """Our row always; the faster-whisper rows only where faster-whisper (the `bench` extra) is installed."""
    require_model("whisper-tiny.en")
    require_speech_clips()
    stdout = run_script("long_transcribe", "--vad-filter", "on", "--temperature", "0")
    (table,) = parse_tables(stdout)
    fw = [(mode, t) for mode in ("fw-seq", "fw-batched") for t in ("float32", "int8")] if FASTER_WHISPER else []
    assert [(r["engine"], r["dtype"]) for r in table] == [("ours", "float32")] + fw
    assert list(table[0])[:10] == ["engine", "dtype", "recordings", "audio s", "wall s", "x realtime", "WER",
                                   "non-speech words", "non-speech words (time share)", "peak RSS MiB"]
    assert list(table[0])[10:] == [f"vs {m}-{t}" for m, t in fw] + ["every run s"]
    for r in table:
        assert r["recordings"] == "1" and 15 < float(r["audio s"]) < 40
        assert float(r["wall s"]) > 0 and float(r["peak RSS MiB"]) > 100
        for column in ("WER", "non-speech words", "non-speech words (time share)"):
            assert 0 <= float(r[column]) < float("inf"), r  # a number (not nan) in [0, inf)
    ours = row(table, "ours", "float32")
    assert all(ours[f"vs {m}-{t}"].endswith("x") for m, t in fw)
    assert all(r[f"vs {m}-{t}"] == "" for r in table[1:] for m, t in fw)
    assert re.search(r"^date: \d{4}-\d\d-\d\d \d\d:\d\d UTC$", stdout, re.M) and "command: " in stdout
    assert "options applied: vad_filter=True" in stdout  # vad_filter is in our transcribe()'s signature
    # temperature: applied where our transcribe() takes it, else named as not applied
    assert re.search(r"options applied: .*temperature=0\.0|not applied: temperature", stdout), stdout
    if not FASTER_WHISPER:
        assert "faster-whisper is not installed (the `bench` extra), skipped" in stdout


def test_vad_backends_quick_agree_with_the_modules_own_forward():
    require_speech_clips()
    (table,) = parse_tables(run_script("vad_backends"))
    expected = ["jit-frames", "jit-batched"] + (["onnx-frames", "onnx-blocks"] if importlib.util.find_spec(
        "onnxruntime") else [])
    assert [r["engine"] for r in table] == expected
    for r in table:
        assert float(r["wall s"]) > 0 and r["flips at 0.5"] == "0" and r["same regions"] == "yes"
        assert float(r["max abs diff vs jit-frames"]) < 1e-4


def test_profile_step_quick_splits_a_prefill_and_a_decode_step_into_categories():
    stdout = run_script("profile_step", "--workload", "decoder")
    assert stdout.startswith("argv: ") and " UTC" in stdout and "cpu " in stdout
    titles = re.findall(r"^(first prefill step \(128 of the 4 x 32 prompt tokens.*|decode step \(batch 4\)): "
                        r"([0-9.]+) ms$", stdout, re.M)
    assert len(titles) == 2 and all(float(ms) > 0 for _, ms in titles), stdout
    for label in ("linear (weights)", "logits projection", "attention", "sampler", "prepare_inputs", "rest"):
        assert len(re.findall(r"^  " + re.escape(label) + r" +-?[0-9.]+ ms +-?[0-9.]+%$", stdout, re.M)) == 2, label
    assert re.search(r"decode linear layers \+ logits: [0-9.]+ GFLOP at [0-9.]+ GFLOP/s", stdout), stdout


def test_profile_step_wall_quick_reports_prefill_and_decode_steps():
    require_model("smollm2-135m")
    stdout = run_script("profile_step", "--mode", "wall")
    prefill = re.search(r"prefill step: ([0-9.]+) s", stdout)
    decode = re.search(r"decode steps: median ([0-9.]+) ms, min ([0-9.]+), max ([0-9.]+) over (\d+) steps", stdout)
    assert prefill and decode, stdout
    assert float(prefill.group(1)) > 0 and int(decode.group(4)) == 3
    assert 0 < float(decode.group(2)) <= float(decode.group(1)) <= float(decode.group(3))


def test_profile_step_linears_quick_times_every_row_count_on_each_packing():
    from seq2seq_engine.kernels.native_linear import panel_linear_available
    stdout = run_script("profile_step", "--mode", "linears")
    assert re.search(r"### quick: one decode step's linears \((\d+) MB", stdout), stdout
    lines = [line for line in stdout.splitlines() if re.match(r"\| \d+ \|", line)]
    assert [line.split("|")[1].strip() for line in lines] == ["1", "9"]
    for line in lines:
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        onednn_ms, onednn_rate = float(cells[1]), float(cells[2])
        assert onednn_ms > 0.001 and onednn_rate > 0
        if panel_linear_available():
            panels_ms, half_unit = float(cells[3]), 0.0005                  # the times are printed to 0.001 ms
            lowest = (panels_ms - half_unit) / (onednn_ms + half_unit) - 0.005
            highest = (panels_ms + half_unit) / (onednn_ms - half_unit) + 0.005
            assert panels_ms > 0 and lowest <= float(cells[5]) <= highest, line
        else:
            assert "panels skipped" in stdout and cells[-1] == ""


def test_profile_step_linears_shapes_are_a_whole_decoder_step():
    """T5-base: 12 layers of self q/k/v, self out, cross q, cross out, gated wi, wo, then the 32128-token head."""
    from benchmarks.profile_step import step_shapes
    shapes = step_shapes("t5")
    assert len(shapes) == 12 * 6 + 1 and shapes[-1] == (768, 32128)
    assert sum(k * n for k, n in shapes) * 4 == 12 * 4 * (768 * (2304 + 3 * 768 + 4096) + 2048 * 768) + 4 * 768 * 32128


def test_linear_kernels_floor_step_plan_packs_prompts_then_decodes_live_requests():
    from benchmarks.lib.floor_replay import step_plan

    # prompts of 3 and 4 tokens fit a budget of 8 together, the 5-token one does not; requests want 2, 3, 1 tokens.
    # Decode step g (token g+1) runs the requests wanting more than g tokens, each reading prompt + g cached tokens.
    plan = step_plan([[7] * 3, [7] * 4, [7] * 5], [2, 3, 1], budget=8)
    assert plan == [(7, 2, 0), (5, 1, 0), (2, 2, (3 + 1) + (4 + 1)), (1, 1, 4 + 2)]
    assert step_plan([[7] * 9], [1], budget=8) == [(9, 1, 0)]  # a prompt longer than the budget still runs alone


def test_linear_kernels_floor_quick_reports_every_engine():
    require_model("smollm2-135m")
    stdout = run_script("linear_kernels", "--mode", "floor")   # one round (run_rounds' order: its own test)
    (table,) = parse_tables(stdout)
    walls = {r["engine"]: float(r["wall s (best)"]) for r in table}
    for r in table:
        assert r["every timed run"] == r["wall s (best)"], table
    assert re.search(r"running floor \.\.\..*running hf \.\.\..*running ours \.\.\.", stdout, re.S), stdout
    assert set(walls) == {"floor", "floor-kv", "hf", "ours"}, table
    assert min(walls.values()) > 0
    for name in ("floor", "floor-kv"):  # one prefill step and 15 decode steps, as the engine runs them
        assert re.search(name + r": 16 steps, prefill [0-9.]+ s, decode [0-9.]+ s", stdout), stdout
        ratio = re.search(f"HF / {name} = " + r"([0-9.]+)x", stdout)
        half_unit = 0.005                                         # the table prints the walls to 0.01 s
        lowest = (walls["hf"] - half_unit) / (walls[name] + half_unit) - 0.005
        highest = (walls["hf"] + half_unit) / (walls[name] - half_unit) + 0.005
        assert ratio and lowest <= float(ratio.group(1)) <= highest, stdout
    assert re.search(r"ours vs HF = [0-9.]+x; same tokens as HF: 100% of the requests", stdout), stdout


def test_linear_kernels_builds_quick_times_each_candidate_in_its_own_process():
    stdout = run_script("linear_kernels", "--mode", "builds", "--candidates", "F.linear-avx2,onednn-avx2")
    assert stdout.startswith("argv: ") and " UTC" in stdout and "cpu " in stdout and "calls=3" in stdout
    assert "| rows | K -> N | F.linear-avx2 | onednn-avx2 |" in stdout and "failed" not in stdout, stdout
    rows = [line.strip("|").split("|") for line in stdout.splitlines() if re.match(r"\| \d+ \| \d+ -> \d+ \|", line)]
    assert [cells[:2] for cells in rows] == [[" 1 ", " 512 -> 512 "]], stdout   # --quick: the first shape only
    assert all(float(cell) >= 0 for cell in rows[0][2:]), stdout


def test_merge_runs_keeps_the_faster_run_every_wall_and_the_higher_peaks():
    from benchmarks.lib.common import EngineRun, merge_runs
    first = EngineRun("ours", "float32", 3.0, [[1]], 100.0, 200.0, 300.0, walls=[3.0, 3.5])
    second = EngineRun("ours", "float32", 2.5, [[2]], 110.0, 150.0, 320.0, walls=[2.5])
    merged = merge_runs(merge_runs(None, first), second)
    assert (merged.wall, merged.outputs, merged.walls) == (2.5, [[2]], [3.0, 3.5, 2.5])
    assert (merged.run_peak_rss_mib, merged.peak_rss_mib) == (200.0, 320.0)


def test_run_rounds_interleaves_the_engines_keeps_the_fastest_and_drops_a_failed_one(monkeypatch):
    from benchmarks.lib import common
    order, walls = [], {"a": iter([3.0, 2.0]), "b": iter([1.0, 4.0])}

    def fake_isolated(target, *args):
        order.append(args[0])
        if args[0] == "c":
            raise RuntimeError("refused dtype")
        wall = next(walls[args[0]])
        return common.EngineRun(args[0], "float32", wall, [[1]], 100.0, 200.0, 300.0, walls=[wall])

    monkeypatch.setattr(common, "run_isolated", fake_isolated)
    failures = []
    specs = [common.EngineSpec(label, print, (label,)) for label in ("a", "c", "b")]
    runs = common.run_rounds(specs, 2, failures)
    assert order == ["a", "c", "b", "a", "b"]          # A, C, B, then A, B: the failed engine is not run again
    assert [(r.engine, r.wall, r.walls) for r in runs] == [("a", 2.0, [3.0, 2.0]), ("b", 1.0, [1.0, 4.0])]
    assert failures == ["c (round 1/2): refused dtype"]
