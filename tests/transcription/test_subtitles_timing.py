"""srt/vtt cue times read back by the `srt` and `webvtt-py` parsers: words timed start == end, words closer than
a minimal cue apart, overlapping and out-of-order words and sub-millisecond cues all give cues that last at least
MIN_CUE_SECONDS and never overlap, in the words' order; on hand-made words, random ones, and whisper-tiny.en's."""
import io
import json

import pytest
from conftest import require_speech_clips
from hypothesis import given, settings, strategies as st

from seq2seq_engine.entrypoints import transcribe_cli
from seq2seq_engine.transcription.output.cue_timing import MIN_CUE_SECONDS
from seq2seq_engine.transcription.output.results import Segment, TranscriptionResult, Word, render
from seq2seq_engine.transcription.output.subtitles import SubtitleOptions

srt = pytest.importorskip("srt")
webvtt = pytest.importorskip("webvtt")
MIN_MS = round(MIN_CUE_SECONDS * 1000)


def result_of(*timed_words):
    """One segment of (start, end, text) words."""
    words = [Word(start, end, " " + text, 0.9) for start, end, text in timed_words]
    text = " ".join(text for _, _, text in timed_words)
    return TranscriptionResult(text, "en", [Segment(words[0].start, words[-1].end, text, words=words)], None,
                               max(word.end for word in words))


def srt_cues(text):
    return [(round(cue.start.total_seconds() * 1000), round(cue.end.total_seconds() * 1000), cue.content)
            for cue in srt.parse(text)]


def vtt_cues(text):
    return [(caption.start_time.in_milliseconds(), caption.end_time.in_milliseconds(), caption.raw_text)
            for caption in webvtt.from_buffer(io.StringIO(text))]


def written_cues(result, options):
    """The (start ms, end ms, text) cues of the srt and of the vtt written, checked to be the same."""
    from_srt, from_vtt = srt_cues(render(result, "srt", options)), vtt_cues(render(result, "vtt", options))
    assert from_srt == from_vtt
    return from_srt


def assert_shown_in_turn(cues):
    assert all(end > start for start, end, _ in cues), cues
    assert all(before[1] <= after[0] for before, after in zip(cues, cues[1:])), cues


ONE_WORD = SubtitleOptions(max_words_per_line=1)


def test_a_zero_length_word_lasts_the_minimum_taken_from_the_silence_after_it():
    cues = written_cues(result_of((42.692, 42.692, "George,"), (43.0, 43.3, "hello.")), ONE_WORD)
    assert cues == [(42692, 42692 + MIN_MS, "George,"), (43000, 43300, "hello.")]
    # the last cue of all has the whole rest of the recording after it
    assert written_cues(result_of((1.0, 1.5, "Bye"), (1.5, 1.5, "now.")), ONE_WORD)[-1] == (1500, 1500 + MIN_MS, "now.")


def test_without_room_the_next_cues_start_later_in_order():
    # the next word starts 8 ms later: it waits for the minimum, and keeps its end
    cues = written_cues(result_of((1.0, 1.0, "a"), (1.008, 1.5, "b")), ONE_WORD)
    assert cues == [(1000, 1000 + MIN_MS, "a"), (1000 + MIN_MS, 1500, "b")]
    # a run of words at one instant (whisper-tiny.en's times for "... hope you enjoyed this")
    cues = written_cues(result_of((2.24, 2.5, "hope"), (2.5, 2.5, "you"), (2.5, 2.5, "enjoyed"), (2.5, 2.72, "this")),
                        ONE_WORD)
    assert cues == [(2240, 2500, "hope"), (2500, 2500 + MIN_MS, "you"), (2500 + MIN_MS, 2500 + 2 * MIN_MS, "enjoyed"),
                    (2500 + 2 * MIN_MS, 2720, "this")]


def test_overlapping_and_out_of_order_words_end_when_the_next_cue_starts():
    cues = written_cues(result_of((1.0, 1.6, "one"), (1.4, 2.0, "two"), (1.9, 1.9, "three"), (3.0, 3.5, "four"),
                                  (2.9, 3.2, "five")), ONE_WORD)
    assert cues == [(1000, 1400, "one"), (1400, 1900, "two"), (1900, 1900 + MIN_MS, "three"),
                    (3000, 3000 + MIN_MS, "four"), (3000 + MIN_MS, 3200, "five")]


def test_rounding_to_the_millisecond_cannot_empty_a_cue():
    # 0.3 ms of speech would round to a cue from 1.000 to 1.000
    cues = written_cues(result_of((1.0001, 1.0004, "tick"), (2.0, 2.5, "tock")), ONE_WORD)
    assert cues == [(1000, 1000 + MIN_MS, "tick"), (2000, 2500, "tock")]
    # highlight_words fills the 0.4 ms between two words with the plain cue
    cues = written_cues(result_of((0.0, 0.3, "One"), (0.3004, 0.6, "two.")), SubtitleOptions(highlight_words=True))
    assert [text for _, _, text in cues] == ["<u>One</u> two.", "One two.", "One <u>two.</u>"]
    assert_shown_in_turn(cues)
    assert cues[0][:2] == (0, 300) and cues[-1][1] == 600


# ------------------------------------------------------------------------------------------------ any word times
@st.composite
def word_times(draw):
    """Words whose starts step forward, stay put or step back (overlaps), lasting nothing, under a millisecond, under
    the minimum or longer."""
    words, time = [], draw(st.floats(0.0, 5.0, allow_subnormal=False))
    for index in range(draw(st.integers(1, 14))):
        time = max(0.0, time + draw(st.sampled_from([0.0, 0.0, 0.0004, 0.01, -0.1, 0.3, 1.5])))
        length = draw(st.sampled_from([0.0, 0.0, 0.0003, 0.015, 0.25])
                      | st.floats(0.0, 2.0, allow_subnormal=False))
        words.append((time, time + length, draw(st.sampled_from(["a", "be", "sea,", "delta."])) + str(index)))
    return words


@settings(max_examples=200, deadline=None)
@given(word_times(), st.sampled_from([None, 1, 2]), st.booleans(), st.sampled_from([1, 6, 42]))
def test_any_word_times_give_cues_in_turn_lasting_at_least_the_minimum(words, per_line, highlight, width):
    options = SubtitleOptions(max_words_per_line=per_line, highlight_words=highlight, max_line_width=width)
    cues = written_cues(result_of(*words), options)
    assert_shown_in_turn(cues)
    assert all(end - start >= MIN_MS for start, end, _ in cues), cues
    assert cues[0][0] == round(words[0][0] * 1000)  # the first cue is never moved
    if not highlight:  # every word shown once, in order
        assert "".join(text for _, _, text in cues).replace("\n", "").replace(" ", "") == "".join(
            text for _, _, text in words)


# ------------------------------------------------------------------------------------------------ whisper-tiny.en
@pytest.fixture(scope="module")
def clip():
    # whisper-tiny.en times three of its 13 words here start == end, two of them at one instant
    return require_speech_clips() + "/ja/pangrama.wav"


def _cli(path, tiny_dir, capsys, *flags):
    assert transcribe_cli.main([path, "--model", tiny_dir, "--quiet", "--kv-cache-space-gb", "0.2", *flags]) == 0
    return capsys.readouterr().out


@pytest.mark.usefixtures("one_thread")
def test_whisper_words_timed_start_equals_end_get_cues_in_turn(clip, tiny_dir, capsys):
    record = json.loads(_cli(clip, tiny_dir, capsys, "--word-timestamps", "--output-format", "json"))
    words = [word for segment in record["segments"] for word in segment["words"]]
    zero_length = [index for index, word in enumerate(words) if word["end"] == word["start"]]
    assert len(zero_length) >= 2, words  # what this test is about
    one_word = srt_cues(_cli(clip, tiny_dir, capsys, "--max-words-per-line", "1", "--output-format", "srt"))
    assert [text for _, _, text in one_word] == [word["word"].strip() for word in words]
    assert_shown_in_turn(one_word)
    assert all(end - start >= MIN_MS for start, end, _ in one_word)
    first_start = round(words[zero_length[0]]["start"] * 1000)
    assert one_word[zero_length[0]][:2] == (first_start, first_start + MIN_MS)
    highlighted = vtt_cues(_cli(clip, tiny_dir, capsys, "--highlight-words", "--output-format", "vtt"))
    assert sum("<u>" in text for _, _, text in highlighted) == len(words)
    assert_shown_in_turn(highlighted)
