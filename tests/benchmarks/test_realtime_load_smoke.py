"""benchmarks/realtime_load.py: --quick end to end (a real `serve` child and the faster-whisper peer, one stream of
one turn), the offline VAD turns the peer gets, and how a stream's turns are scored."""
import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
pytest.importorskip("websockets")
pytest.importorskip("pytest_audioeval")
from benchmarks.lib import realtime_streams  # noqa: E402
from benchmarks.lib.long_audio import Part, Recording  # noqa: E402
from seq2seq_engine.audio import SAMPLE_RATE  # noqa: E402
from seq2seq_engine.transcription.live import TurnDetection  # noqa: E402

FASTER_WHISPER = importlib.util.find_spec("faster_whisper") is not None


def test_quick_run_transcribes_the_turn_with_both_engines(tmp_path):
    out = tmp_path / "realtime.json"
    result = subprocess.run([sys.executable, "-m", "benchmarks.realtime_load", "--quick",
                             "--out", str(out)], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    data = json.loads(out.read_text())
    engines = ["ours", "fw"] if FASTER_WHISPER else ["ours"]
    assert [run["engine"] for run in data["runs"]] == engines
    for run in data["runs"]:
        (turn,) = run["turns"]
        summary = run["summary"]
        assert (summary["turns"], summary["missed"], summary["errors"]) == (1, 0, 0)
        assert turn["wer"] <= 0.2, turn  # tiny.en on a clean clip
        # the transcript cannot be final before the server VAD's silence has passed, nor take most of a minute
        assert 0.0 < turn["latency"] < 20.0 and turn["first_text"] > 0.0
        assert summary["latency_p50"] == summary["latency_p95"] == pytest.approx(turn["latency"])
        assert summary["cpu_s"] > 0
        row = f"| {run['engine']} | 1 | 1 | 0 | {turn['latency']:.3f} / {turn['latency']:.3f} |"
        assert row in result.stdout
    sustained = {run["engine"]: 1 if run["summary"]["latency_p95"] <= 1.5 else 0 for run in data["runs"]}
    assert {k: data["sustained"][k] for k in engines} == sustained
    assert "largest N (of 1) with p95 latency <= 1.5 s" in result.stdout


def test_offline_vad_turns_hold_each_utterance_and_end_after_the_silence():
    recording = realtime_streams.build_streams(1, 12.0, seed=5, espeak=False)[0]
    spoken = [p for p in recording.parts if p.kind == "speech"]
    turns = realtime_streams.vad_turns(recording, 0.1, TurnDetection(0.5, 300, 500))
    assert len(turns) == len(spoken) >= 2
    for turn, part in zip(turns, spoken):
        assert turn.start <= part.start + 0.1 and turn.end >= part.end
        assert 0.3 <= turn.end - part.end <= 1.0  # 500 ms of silence frames, give or take the VAD's tail
        at = int(round(turn.start * SAMPLE_RATE))
        np.testing.assert_allclose(turn.samples, recording.samples[at:at + len(turn.samples)], atol=1e-6)
        assert turn.chunk == int(np.ceil(turn.end / 0.1)) - 1  # the chunk whose arrival ends the turn


def test_score_stream_assigns_items_by_overlap_and_measures_from_the_utterance_end():
    rng = np.random.default_rng(1)
    parts = [Part("silence", 0, 1), Part("speech", 1, 3, "red green blue"), Part("silence", 3, 5),
             Part("speech", 5, 6, "dark night"), Part("silence", 6, 8)]
    recording = Recording("s", rng.normal(0, 0.1, 8 * SAMPLE_RATE).astype(np.float32), parts)
    items = [{"start": 0.8, "end": 2.0, "first": 1.0, "done": 2.1, "text": "red green"},  # the turn split in two
             {"start": 2.1, "end": 3.6, "first": 1.6, "done": 2.0, "text": "blue"},
             {"start": 3.8, "end": 4.2, "first": 2.3, "done": 2.4, "text": "uh"},   # in the pause
             {"start": 4.8, "end": 6.5, "first": None, "done": None, "text": ""}]   # never completed
    rows, stray = realtime_streams.score_stream(recording, items, pace=2.0)
    assert stray == 1
    first, second = rows
    assert first["transcript"] == "red green blue" and first["wer"] == 0.0
    assert first["latency"] == pytest.approx(2.1 - 3 / 2.0) and first["first_text"] == pytest.approx(1.0 - 0.5)
    assert second["latency"] is None and second["wer"] == 1.0
    summary = realtime_streams.summarize(rows, stray)
    assert (summary["turns"], summary["missed"], summary["stray_items"]) == (2, 1, 1)
    assert summary["wer"] == pytest.approx(2 / 5)


def test_turn_wer_counts_numbers_written_apart_or_together_as_the_same_words():
    counting = "One two three four five six seven eight nine ten."
    assert realtime_streams.turn_wer([(counting, "1-2-3-4-5-6-7-8-9-10.")]) == 0.0
    assert realtime_streams.turn_wer([(counting, "1, 2, 3, 4, 5, 6, 7, 8, 9, 10.")]) == 0.0
    assert realtime_streams.turn_wer([("The quick brown fox.", "The quick brown box.")]) == pytest.approx(1 / 4)
    assert realtime_streams.turn_wer([("Room 12 is free.", "Room 13 is free."),
                                      ("See you soon.", "")]) == pytest.approx(4 / 7)
