"""Transcription with vad_filter=True, end to end with the real whisper-tiny.en and Silero VAD weights: two speech
clips (pytest-audioeval) 20 s of silence and noise apart come out as the clips' reference words, with segment times
inside the clips' spans of the original recording and nothing in the gap; audio without speech is never decoded;
the CLI flags."""
import json
import os
import re

import numpy as np
import pytest
import soundfile
from conftest import require_speech_clips

from seq2seq_engine.audio import load_audio
from seq2seq_engine.entrypoints import transcribe_cli
from seq2seq_engine.transcription.schedule import result_assembler

pytestmark = pytest.mark.usefixtures("one_thread")
SR = 16000
TOLERANCE = 0.5  # s: speech_pad_ms (0.4 s) plus a Whisper timestamp step or two


def _clip(name):
    path = os.path.join(require_speech_clips(), "en", name)
    with open(path.replace(".wav", ".txt"), encoding="utf-8") as handle:
        return load_audio(path), handle.read()


def words(text):
    return re.sub(r"[^a-z0-9' ]", " ", text.lower()).split()


@pytest.fixture(scope="module")
def two_clips():
    """2 s silence, "Hello world.", 10 s silence + 10 s noise, "The quick brown fox ...", 1 s silence; with the
    clips' (start, end) seconds in the recording and their reference texts."""
    (hello, hello_text), (fox, fox_text) = _clip("hello_world.wav"), _clip("quick_brown_fox.wav")
    noise = 0.01 * np.random.default_rng(0).standard_normal(10 * SR)
    parts = [np.zeros(2 * SR), hello, np.zeros(10 * SR), noise, fox, np.zeros(SR)]
    starts = np.cumsum([0] + [len(p) for p in parts]) / SR
    spans = [(starts[1], starts[2]), (starts[4], starts[5])]
    return np.concatenate(parts).astype(np.float32), spans, hello_text + " " + fox_text


@pytest.fixture()
def engine_spy(tiny_llm, monkeypatch):
    """The windows stitched per input, and the number of requests the engine was given."""
    seen = {"windows": [], "requests": 0}
    real_stitch, real_add = result_assembler.stitch, tiny_llm.llm_engine.add_request

    def stitch(windows, *args, **kwargs):
        seen["windows"].append(list(windows))
        return real_stitch(windows, *args, **kwargs)

    def add_request(*args, **kwargs):
        seen["requests"] += 1
        return real_add(*args, **kwargs)

    monkeypatch.setattr(result_assembler, "stitch", stitch)
    monkeypatch.setattr(tiny_llm.llm_engine, "add_request", add_request)
    return seen


def check_segments(segments, spans):
    """Every segment inside one clip's span (within TOLERANCE), each clip with a segment, none in the gap."""
    assert segments
    placed = []
    for segment in segments:
        inside = [k for k, (start, end) in enumerate(spans)
                  if start - TOLERANCE <= segment.start <= segment.end <= end + TOLERANCE]
        assert inside, f"{segment} is not inside a clip's span {spans}"
        placed.append(inside[0])
    assert sorted(set(placed)) == list(range(len(spans)))
    assert placed == sorted(placed)  # in order


@pytest.mark.parametrize("sequential", [False, True])
def test_two_clips_with_a_gap_give_their_words_and_times_on_the_original_timeline(
        tiny_llm, two_clips, engine_spy, sequential):
    audio, spans, reference = two_clips
    (result,) = tiny_llm.transcribe([(audio, SR)], vad_filter=True, timestamps=True, beam_width=1,
                                    condition_on_previous_text=sequential, use_tqdm=False)
    assert result.error is None and result.duration == len(audio) / SR
    assert words(result.text) == words(reference)
    check_segments(result.segments, spans)
    (windows,) = engine_spy["windows"]
    assert len(windows) == 1 and engine_spy["requests"] == 1  # both regions in one window; the gap not decoded
    assert windows[0].duration < 10  # the 20 s gap is not in it


def test_segments_over_a_splice_are_split_by_their_words_at_the_default_beam_width(tiny_llm, two_clips):
    audio, spans, reference = two_clips
    # 5 beams write "<|0.00|> Hello world. The quick brown fox ...<|4.24|>" over both packed clips here: placed
    # whole, "Hello world." was timed in the second clip, 20 s late
    (result,) = tiny_llm.transcribe([(audio, SR)], vad_filter=True, timestamps=True, use_tqdm=False)
    assert words(result.text) == words(reference)
    check_segments(result.segments, spans)
    assert all(segment.words is None for segment in result.segments)  # timed to split them, not shown


def test_by_default_vad_runs_on_inputs_longer_than_one_window_only(tiny_llm, two_clips, engine_spy):
    audio, spans, reference = two_clips
    assert len(audio) < 30 * SR
    longer = np.concatenate([audio, np.zeros(10 * SR, np.float32)])
    short_result, long_result = tiny_llm.transcribe([(audio, SR), (longer, SR)], timestamps=True, beam_width=1,
                                                    use_tqdm=False)
    assert words(long_result.text) == words(reference)
    assert short_result.error is None and "hello" in words(short_result.text)
    short_windows, long_windows = engine_spy["windows"]
    assert [w.duration for w in short_windows] == [len(audio) / SR]  # one plain window: the whole input
    assert len(long_windows) == 1 and long_windows[0].duration < 10  # the speech regions packed, the gaps left out
    check_segments(long_result.segments, spans)
    (plain,) = tiny_llm.transcribe([(longer, SR)], vad_filter=False, use_tqdm=False)
    assert engine_spy["windows"][-1][0].duration == 30.0  # off: 30 s cuts


def test_without_timestamps_the_text_is_the_same(tiny_llm, two_clips):
    audio, spans, reference = two_clips
    (result,) = tiny_llm.transcribe((audio, SR), vad_filter=True, use_tqdm=False,
                                    vad_parameters={"min_silence_duration_ms": 160})
    assert words(result.text) == words(reference)
    (segment,) = result.segments  # one per window, from its first region's start to its last region's end
    assert spans[0][0] - TOLERANCE <= segment.start and segment.end <= spans[1][1] + TOLERANCE


def test_audio_without_speech_is_never_decoded(tiny_llm, engine_spy):
    t = np.arange(8 * SR) / SR
    silence_noise_tone = np.concatenate([np.zeros(5 * SR), 0.01 * np.random.default_rng(1).standard_normal(7 * SR),
                                         0.1 * np.sin(2 * np.pi * 440 * t)]).astype(np.float32)
    results = tiny_llm.transcribe([(silence_noise_tone, SR), (np.zeros(SR, np.float32), SR)], vad_filter=True,
                                  timestamps=True, use_tqdm=False)
    assert [(r.text, r.segments, r.error) for r in results] == [("", [], None), ("", [], None)]
    assert results[0].duration == 20.0
    assert engine_spy["requests"] == 0


def test_vad_parameters_are_checked(tiny_llm):
    with pytest.raises(ValueError, match="unknown vad_parameters"):
        tiny_llm.transcribe((np.zeros(SR, np.float32), SR), vad_filter=True, vad_parameters={"treshold": 0.3})
    with pytest.raises(ValueError, match="threshold"):
        tiny_llm.transcribe((np.zeros(SR, np.float32), SR), vad_filter=True, vad_parameters={"threshold": 3})


def test_cli_vad_flags(tmp_path, tiny_dir, two_clips, capsys):
    audio, spans, reference = two_clips
    path = tmp_path / "two_clips.wav"
    soundfile.write(path, audio, SR, subtype="FLOAT")
    status = transcribe_cli.main([str(path), "--model", tiny_dir, "--vad-filter", "--vad-min-silence-ms", "500",
                                  "--vad-threshold", "0.5", "--timestamps", "--output-format", "json", "--quiet",
                                  "--kv-cache-space-gb", "0.3"])
    record = json.loads(capsys.readouterr().out)
    assert status == 0 and words(record["text"]) == words(reference)
    for segment in record["segments"]:
        assert any(start - TOLERANCE <= segment["start"] <= segment["end"] <= end + TOLERANCE
                   for start, end in spans)
    status = transcribe_cli.main([str(path), "--model", tiny_dir, "--vad-threshold", "0.3", "--no-vad-filter",
                                  "--quiet"])
    assert status == transcribe_cli.EXIT_USAGE
    assert "--vad-threshold cannot be used with --no-vad-filter" in capsys.readouterr().err
