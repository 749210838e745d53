"""benchmarks/cache_reuse.py --quick: every workload runs with its cache on and off, prints its tables and writes its
JSON; the caches change how often the encoder runs but no output, and this engine's translations equal HF's."""
import json
import os
import subprocess
import sys

from conftest import require_model, require_speech_clips

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ENGLISH_CLIPS = 1   # --quick: the first clip of pytest-audioeval's en/ folder


def run_quick(tmp_path, workloads: str) -> dict:
    out = tmp_path / "cache_reuse.json"
    result = subprocess.run([sys.executable, "-m", "benchmarks.cache_reuse", "--quick",
                             "--threads", "1", "--workloads", workloads, "--out", str(out)],
                            capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "FAILED" not in result.stdout and "## summary" in result.stdout, result.stdout
    assert "load average" in result.stdout and ", cpu " in result.stdout   # the machine header
    report = json.loads(out.read_text())
    for runs in report["runs"].values():
        assert all(len(rounds) == 1 and rounds[0]["wall_s"] > 0 and rounds[0]["stats"]["cpu_s"] > 0
                   for rounds in runs.values())
    return report


def stats(report: dict, workload: str, label: str) -> dict:
    return report["runs"][workload][label][0]["stats"]


def test_translate_cache_runs_one_encoder_and_matches_hf(tmp_path):
    report = run_quick(tmp_path, "translate")
    runs = report["runs"]["translate"]
    assert set(runs) == {"translate ours cache on", "translate ours cache off", "translate hf"}
    assert stats(report, "translate", "translate ours cache on")["encoder_runs"] == 1
    assert stats(report, "translate", "translate ours cache off")["encoder_runs"] == 4
    ratios = [row[2:4] for row in report["summary"] if row[0] == "translate"]
    assert len(ratios) == 2 and all(float(cell.split()[0]) > 0 for row in ratios for cell in row), ratios
    # HF generate on the same weights is the reference for the tokens of both cache settings
    assert {label: (row["same"], row["common_prefix"]) for label, row in report["agreement"].items()} == {
        label: (1.0, 1.0) for label in runs}


def test_whisper_and_chat_cache_on_and_off_agree(tmp_path):
    require_model("whisper-base")
    require_model("smollm2-135m")
    require_speech_clips()
    report = run_quick(tmp_path, "whisper,chat")
    whisper = report["runs"]["whisper"]
    assert len(whisper) == 6   # plain, words, detect x cache on, off
    for mode in ("plain", "words", "detect"):
        on = stats(report, "whisper", f"whisper {mode} cache on")
        off = stats(report, "whisper", f"whisper {mode} cache off")
        assert on["clips"] == off["clips"] == ENGLISH_CLIPS
        assert on["languages_right"] == off["languages_right"] == ENGLISH_CLIPS
        assert (on["words"] > 0) == (off["words"] > 0) == (mode == "words")
    # detection and the decode read one encoder output with the cache, two without
    assert stats(report, "whisper", "whisper detect cache on")["encoder_runs"] == ENGLISH_CLIPS
    assert stats(report, "whisper", "whisper detect cache off")["encoder_runs"] == 2 * ENGLISH_CLIPS
    for label in ("chat prefix cache on", "chat prefix cache off"):
        chat = stats(report, "chat", label)
        assert chat["generated_tokens"] == 4 * 4
        assert 0 < chat["ttft_p50_s"] <= chat["ttft_p90_s"]
    assert stats(report, "chat", "chat prefix cache off")["prefix_hit_tokens"] == 0
    # the caches change no output: each configuration's outputs equal those of its cache off
    assert {label: (row["same"], row["common_prefix"]) for label, row in report["agreement"].items()} == {
        label: (1.0, 1.0) for label in list(whisper) + list(report["runs"]["chat"])}
