"""srt/vtt cue cutting (transcription/output/subtitles.py) on hand-made segments and words: line width and count, breaks
at punctuation, long words, CJK text, interpolated times, pauses, the 7 s cap, highlight_words, validation; the
output read back by the `srt` and `webvtt-py` parsers; json keeps the decoder's segments."""
import io
import json

import pytest
from hypothesis import given, settings, strategies as st

from seq2seq_engine.transcription.output.cue_timing import MIN_CUE_SECONDS, to_milliseconds
from seq2seq_engine.transcription.output.results import Segment, TranscriptionResult, Word, render, to_srt, to_vtt
from seq2seq_engine.transcription.output.subtitles import (MAX_CUE_SECONDS, PAUSE_SECONDS, SubtitleOptions,
                                                           subtitle_cues, subtitle_options)

srt = pytest.importorskip("srt")
webvtt = pytest.importorskip("webvtt")


def timed_words(text, start=0.0, step=0.4, gaps=None):
    """Words of `text` back to back, each `step` long; gaps: {word index: silence before it}."""
    words, time = [], start
    for index, word in enumerate(text.split()):
        time += (gaps or {}).get(index, 0.0)
        words.append(Word(time, time + step, " " + word, 0.9))
        time += step
    return words


def result_of(*segments):
    return TranscriptionResult(" ".join(s.text for s in segments), "en", list(segments), None,
                               max([s.end for s in segments] + [0.0]))


def worded(text, **kwargs):
    words = timed_words(text, **kwargs)
    return Segment(words[0].start, words[-1].end, text, words=words)


def cue_lines(cues):
    return [cue.text.split("\n") for cue in cues]


# ------------------------------------------------------------------------------------------------ lines
def test_lines_are_broken_at_words_within_the_width_and_count():
    text = ("Whisper models were trained on a large amount of speech and the subtitles they make should be easy to "
            "read on a screen")
    options = SubtitleOptions(max_line_width=30, max_line_count=2, max_cue_seconds=60)
    cues = subtitle_cues([worded(text, step=0.1)], options)
    lines = [line for cue in cue_lines(cues) for line in cue]
    assert all(len(line) <= 30 for line in lines) and all(len(cue) <= 2 for cue in cue_lines(cues))
    assert " ".join(lines).split() == text.split()  # broken between words only, none lost
    assert lines == ["Whisper models were trained on", "a large amount of speech and",
                     "the subtitles they make should", "be easy to read on a screen"]  # each as full as it can be


def test_a_line_ends_after_punctuation_when_it_can():
    text = "This is the first sentence, and this is the second."
    [cue] = subtitle_cues([worded(text, step=0.1)], SubtitleOptions())
    assert cue.text == "This is the first sentence,\nand this is the second."
    # a cue too: two short sentences that need three lines are cut after the first one's full stop
    text = "The meeting starts at nine. Please bring the quarterly report and your laptop with you today."
    cues = subtitle_cues([worded(text, step=0.1)], SubtitleOptions(max_line_width=30))
    assert [cue.text for cue in cues][0] == "The meeting starts at nine."


def test_a_word_longer_than_a_line_is_cut_and_a_shorter_one_moves_to_the_next_line():
    word = "Pneumonoultramicroscopicsilicovolcanoconiosis"  # 45 characters
    [cue] = subtitle_cues([worded(f"a {word}", step=1.0)], SubtitleOptions(max_line_width=20, max_line_count=4))
    assert cue.text.split("\n") == ["a", word[:20], word[20:40], word[40:]]
    [cue] = subtitle_cues([worded("tiny wonderful", step=1.0)], SubtitleOptions(max_line_width=12))
    assert cue.text == "tiny\nwonderful"


def test_cjk_text_without_spaces_is_broken_between_characters_preferring_its_punctuation():
    text = "我们今天讨论的是一个非常重要的问题，需要大家认真思考。然后我们继续下一个话题。"
    cues = subtitle_cues([Segment(0.0, 6.0, text)], SubtitleOptions(max_line_width=12, max_line_count=1))
    assert [cue.text for cue in cues] == ["我们今天讨论的是一个非常", "重要的问题，", "需要大家认真思考。",
                                          "然后我们继续下一个话题。"]  # cut after the CJK comma and full stop
    assert [(round(cue.start, 2), round(cue.end, 2)) for cue in cues][:2] == [(0.0, 1.85), (1.85, 2.77)]  # 12/39
    [first, second] = subtitle_cues([Segment(0.0, 6.0, text)], SubtitleOptions(max_line_width=12))
    assert first.text == "我们今天讨论的是一个非常\n重要的问题，" and second.start == first.end
    japanese = subtitle_cues([Segment(0.0, 2.0, "「こんにちは」と言った。")], SubtitleOptions(max_line_width=4))
    assert [line for cue in cue_lines(japanese) for line in cue] == ["「こんに", "ちは」と", "言った。"]


def test_a_segment_without_words_gets_times_shared_out_by_characters():
    cues = subtitle_cues([Segment(10.0, 18.0, "aa bbbbbb")], SubtitleOptions(max_line_width=6, max_line_count=1))
    assert [(cue.start, cue.end, cue.text) for cue in cues] == [(10.0, 12.0, "aa"), (12.0, 18.0, "bbbbbb")]
    # segments join into one cue unless a pause > PAUSE_SECONDS separates them; their texts get a space
    close = [Segment(0.0, 1.0, "Hello."), Segment(1.5, 2.0, "Hi."), Segment(2.0 + PAUSE_SECONDS + 0.1, 4.0, "Bye.")]
    assert [(c.start, c.end, c.text) for c in subtitle_cues(close, SubtitleOptions())] == [
        (0.0, 2.0, "Hello. Hi."), (3.1, 4.0, "Bye.")]


def test_pauses_between_words_end_a_cue():
    segment = worded("one two three four five six", gaps={2: PAUSE_SECONDS + 0.2, 4: PAUSE_SECONDS - 0.2})
    cues = subtitle_cues([segment], SubtitleOptions())
    assert [cue.text for cue in cues] == ["one two", "three four five six"]
    assert (cues[0].start, cues[0].end) == (0.0, pytest.approx(0.8))
    assert (cues[1].start, cues[1].end) == (pytest.approx(2.0), pytest.approx(4.4))


def test_no_cue_lasts_longer_than_the_cap():
    segment = worded(" ".join(["word"] * 40), step=0.5)  # 20 s of short words: one line would hold 8
    cues = subtitle_cues([segment], SubtitleOptions())
    assert all(cue.end - cue.start <= MAX_CUE_SECONDS for cue in cues) and len(cues) == 3
    # a single unit longer than the cap: cut to the cap, inside its segment
    [cue] = subtitle_cues([Segment(30.0, 60.0, "Okay.")], SubtitleOptions())
    assert (cue.start, cue.end, cue.text) == (30.0, 30.0 + MAX_CUE_SECONDS, "Okay.")


def test_max_words_per_line_gives_one_line_cues_unless_a_line_count_is_given():
    segment = worded("one two three four five")
    assert [c.text for c in subtitle_cues([segment], SubtitleOptions(max_words_per_line=2))] == [
        "one two", "three four", "five"]
    options = SubtitleOptions(max_words_per_line=2, max_line_count=2)
    assert [c.text for c in subtitle_cues([segment], options)] == ["one two\nthree four", "five"]


# ------------------------------------------------------------------------------------------------ highlight
def test_highlight_words_underlines_each_word_and_fills_the_gaps_with_the_plain_cue():
    words = [Word(0.0, 0.4, " One", 0.9), Word(0.6, 0.9, " two", 0.9), Word(0.9, 1.5, " three.", 0.9)]
    result = result_of(Segment(0.0, 1.6, "One two three.", words=words))
    assert to_srt(result, highlight_words=True) == (
        "1\n00:00:00,000 --> 00:00:00,400\n<u>One</u> two three.\n\n"
        "2\n00:00:00,400 --> 00:00:00,600\nOne two three.\n\n"
        "3\n00:00:00,600 --> 00:00:00,900\nOne <u>two</u> three.\n\n"
        "4\n00:00:00,900 --> 00:00:01,500\nOne two <u>three.</u>\n")
    with pytest.raises(ValueError, match="highlight_words"):
        to_vtt(result_of(Segment(0.0, 1.6, "One two three.")), SubtitleOptions(highlight_words=True))


# ------------------------------------------------------------------------------------------------ options
@pytest.mark.parametrize("fields, message", [
    ({"max_line_width": 0}, "max_line_width must be an int >= 1"), ({"max_line_width": True}, "max_line_width"),
    ({"max_line_width": None}, "max_line_width"), ({"max_line_count": 0}, "max_line_count must be an int >= 1"),
    ({"max_words_per_line": -2}, "max_words_per_line must be an int >= 1"),
    ({"max_words_per_line": 2.0}, "max_words_per_line"), ({"highlight_words": "yes"}, "highlight_words"),
    ({"max_cue_seconds": 0}, "max_cue_seconds must be a finite number of seconds > 0"),
    ({"pause_seconds": float("nan")}, "pause_seconds"), ({"pause_seconds": -1.0}, "pause_seconds .* >= 0"),
])
def test_bad_options_are_a_value_error_naming_the_field_and_its_limit(fields, message):
    with pytest.raises(ValueError, match=message):
        SubtitleOptions(**fields)


def test_the_writers_take_options_an_int_or_fields():
    result = result_of(worded("one two three"))
    assert subtitle_options(None) == SubtitleOptions() and subtitle_options(2) == SubtitleOptions(max_words_per_line=2)
    assert render(result, "srt", 2) == to_srt(result, SubtitleOptions(max_words_per_line=2))
    assert render(result, "vtt", max_words_per_line=1) == to_vtt(result, 1)
    assert render(result, "srt", SubtitleOptions(max_line_width=8), max_line_count=1) == to_srt(
        result, max_line_width=8, max_line_count=1)
    for bad in ("2", 2.5, True):
        with pytest.raises(ValueError):
            render(result, "srt", bad)


# ------------------------------------------------------------------------------------------------ formats
def _long_result():
    first = worded("Good morning everyone, and welcome to the quarterly meeting of the whole company. "
                   "We have a lot to cover today, so let us start with the numbers.", step=0.3)
    second = Segment(first.end + 2.5, first.end + 14.5,
                     "After the break we will hear from the engineering team about the new release and its schedule.")
    return result_of(first, second)


def test_srt_and_vtt_parse_back_to_the_cues():
    result = _long_result()
    cues = subtitle_cues(result.segments, SubtitleOptions())
    parsed = list(srt.parse(to_srt(result)))
    assert [(s.index, s.content) for s in parsed] == [(n, c.text) for n, c in enumerate(cues, 1)]
    assert [(s.start.total_seconds(), s.end.total_seconds()) for s in parsed] == [
        (round(c.start, 3), round(c.end, 3)) for c in cues]
    captions = webvtt.from_buffer(io.StringIO(to_vtt(result)))
    assert [c.text for c in captions] == [c.text for c in cues]
    assert [(c.start_time.in_milliseconds(), c.end_time.in_milliseconds()) for c in captions] == [
        (round(c.start * 1000), round(c.end * 1000)) for c in cues]
    highlighted = webvtt.from_buffer(io.StringIO(to_vtt(result_of(result.segments[0]), highlight_words=True)))
    assert all(c.raw_text.count("<u>") == 1 for c in highlighted if "<u>" in c.raw_text)
    assert sum("<u>" in c.raw_text for c in highlighted) == len(result.segments[0].words)


def test_json_keeps_the_decoders_segments():
    result = _long_result()
    assert len(subtitle_cues(result.segments, SubtitleOptions())) > len(result.segments)
    record = json.loads(render(result, "json", SubtitleOptions(max_line_width=10)))
    assert record["segments"] == [segment.to_dict() for segment in result.segments]
    assert render(result, "txt", 3) == result.text + "\n"


# ------------------------------------------------------------------------------------------------ invariants
@st.composite
def transcripts(draw):
    """Segments with and without words, with random words, lengths, pauses and CJK text."""
    segments, time = [], 0.0
    for _ in range(draw(st.integers(1, 4))):
        time += draw(st.floats(0.0, 3.0, allow_subnormal=False))
        texts = draw(st.lists(st.text("abcdefghij,.", min_size=1, max_size=25).filter(str.strip)
                              | st.sampled_from(["我们", "好。", "x" * 50]), min_size=1, max_size=12))
        if draw(st.booleans()):
            words = []
            for text in texts:
                time += draw(st.sampled_from([0.0, 0.1, 0.9, 1.5]))
                length = draw(st.floats(0.0, 2.5, allow_subnormal=False))
                words.append(Word(time, time + length, " " + text.strip(), 0.9))
                time += length
            segments.append(Segment(words[0].start, words[-1].end, " ".join(texts), words=words))
        else:
            length = draw(st.floats(0.1, 30.0, allow_subnormal=False))
            segments.append(Segment(time, time + length, " ".join(texts)))
            time += length
    return segments


def timed_spans(segments):
    """The times the cues are cut from: each word, or each segment without words."""
    return [(w.start, w.end) for s in segments for w in s.words] if all(s.words for s in segments) else [
        span for s in segments for span in ([(w.start, w.end) for w in s.words] if s.words else [(s.start, s.end)])]


@settings(max_examples=150, deadline=None)
@given(transcripts(), st.integers(3, 50), st.integers(1, 3), st.sampled_from([None, 1, 3]))
def test_every_cue_keeps_the_limits_and_shows_every_word_once_inside_its_time(segments, width, count, words):
    options = SubtitleOptions(max_line_width=width, max_line_count=count, max_words_per_line=words)
    cues = subtitle_cues(segments, options)
    spans = timed_spans(segments)
    pauses = [(a_end, b_start) for (_, a_end), (b_start, _) in zip(spans, spans[1:]) if b_start - a_end > 1.0]
    for index, cue in enumerate(cues):
        lines = cue.text.split("\n")
        assert len(lines) <= count and all(0 < len(line) <= width for line in lines)
        assert words is None or all(len(line.split()) <= words for line in lines)
        assert MIN_CUE_SECONDS - 1e-9 <= cue.end - cue.start <= MAX_CUE_SECONDS + 1e-9
        # starts and ends in speech shown, give or take the millisecond and what minimal durations before it added
        late = MIN_CUE_SECONDS * (index + 1) + 1e-3
        assert any(start - 1e-3 <= cue.start <= end + late for start, end in spans)
        assert any(start - 1e-3 <= cue.end <= end + late for start, end in spans)
        assert not any(cue.start < a - 1e-3 and cue.end > b + 1e-3 for a, b in pauses)
        assert all(time == to_milliseconds(time) / 1000 for time in (cue.start, cue.end))  # as srt / vtt write it
    assert all(a.end <= b.start for a, b in zip(cues, cues[1:]))
    shown = "".join(cue.text for cue in cues).replace("\n", "").replace(" ", "")
    assert shown == "".join(s.text for s in segments).replace(" ", "")
