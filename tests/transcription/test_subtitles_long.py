"""srt from the real CLI on a minute of speech between pauses, noise and music (benchmarks/lib/long_audio.py, built
from the bundled clips and espeak-ng sentences) with whisper-tiny.en: by default (word timings) every cue within the
limits, none across a pause of the word timings, each timed by the words it shows (but for minimal durations) and
inside the recording's speech; with --timestamps (timestamp tokens, no word timings) within the limits and inside
the speech too."""
import json
import shutil

import pytest
from conftest import require_speech_clips

from benchmarks.lib import long_audio
from seq2seq_engine.entrypoints import transcribe_cli
from seq2seq_engine.transcription.output.cue_timing import MIN_CUE_SECONDS
from seq2seq_engine.transcription.output.subtitles import MAX_CUE_SECONDS, PAUSE_SECONDS

srt = pytest.importorskip("srt")

pytestmark = pytest.mark.usefixtures("one_thread")
TOLERANCE = 0.6  # s: a word's DTW time next to silence, VAD's 0.4 s padding


@pytest.fixture(scope="module")
def recording(tmp_path_factory):
    require_speech_clips()
    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng is not installed")
    [recording] = long_audio.build_recordings(1, 60.0, seed=2)
    return recording, long_audio.write(recording, str(tmp_path_factory.mktemp("long")))


def _cli(path, tiny_dir, capsys, *flags):
    assert transcribe_cli.main([path, "--model", tiny_dir, "--quiet", "--kv-cache-space-gb", "0.2", *flags]) == 0
    return capsys.readouterr().out


def _check_limits(cues, width):
    for cue in cues:
        lines = cue.content.split("\n")
        assert len(lines) <= 2 and all(0 < len(line) <= width for line in lines), cue
        assert 0 <= (cue.end - cue.start).total_seconds() <= MAX_CUE_SECONDS, cue


def _words_of_cues(cues, words):
    """The reference words each cue shows, in order (the cues' texts are the words' texts, re-spaced)."""
    shown, position = [], 0
    for cue in cues:
        text, taken = cue.content.replace("\n", " ").replace(" ", ""), []
        while text:
            word = words[position]["word"].strip()
            assert text.startswith(word), (cue.content, word)
            text, position = text[len(word):], position + 1
            taken.append(words[position - 1])
        shown.append(taken)
    assert position == len(words)
    return shown


def test_default_cues_keep_the_limits_pauses_and_speech_of_the_word_timings(recording, tiny_dir, capsys):
    recording, path = recording
    record = json.loads(_cli(path, tiny_dir, capsys, "--word-timestamps", "--output-format", "json"))
    words = [word for segment in record["segments"] for word in segment["words"]]
    cues = list(srt.parse(_cli(path, tiny_dir, capsys, "--output-format", "srt", "--max-line-width", "32")))
    assert len(cues) >= len(recording.speech_spans) and len(words) > 50
    _check_limits(cues, 32)
    pauses = [(a["end"], b["start"]) for a, b in zip(words, words[1:]) if b["start"] - a["end"] > PAUSE_SECONDS]
    assert len(pauses) >= len(recording.speech_spans) - 2  # the gaps between utterances
    shown_until = 0.0
    for cue, shown in zip(cues, _words_of_cues(cues, words)):
        start, end = cue.start.total_seconds(), cue.end.total_seconds()
        assert not any(start < a and end > b for a, b in pauses), cue
        # timed by its words, unless the cue before ran on (its minimal duration) or its own was lengthened to it
        assert start == pytest.approx(shown[0]["start"], abs=1e-3) or start == shown_until > shown[0]["start"], cue
        assert end == pytest.approx(shown[-1]["end"], abs=1e-3) or end - start == pytest.approx(MIN_CUE_SECONDS), cue
        shown_until = end
        for time in (start, end):
            assert any(s - TOLERANCE <= time <= e + TOLERANCE for s, e in recording.speech_spans), (cue, time)


def test_timestamp_token_cues_keep_the_limits_inside_the_recordings_speech(recording, tiny_dir, capsys):
    recording, path = recording
    cues = list(srt.parse(_cli(path, tiny_dir, capsys, "--timestamps", "--output-format", "srt")))
    _check_limits(cues, 42)
    assert len(cues) >= len(recording.speech_spans)
    for cue in cues:  # timestamp tokens place phrases within VAD's speech regions
        for time in (cue.start.total_seconds(), cue.end.total_seconds()):
            assert any(s - TOLERANCE <= time <= e + TOLERANCE for s, e in recording.speech_spans), (cue, time)
