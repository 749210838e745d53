"""hallucination_silence_threshold: openai-whisper's anomaly scores and silence tests, worked by hand."""
import pytest

from seq2seq_engine.transcription.decode.hallucination import (drop_segments, hallucinated_segments, is_segment_anomaly,
                                                               word_anomaly_score)
from seq2seq_engine.transcription.timing.words import WordTiming


def _word(start, end, probability=0.9, text=" word"):
    return WordTiming(text, [1], start, end, probability)


def _speech(start, end, count=4):
    step = (end - start) / count
    return [_word(start + k * step, start + (k + 1) * step) for k in range(count)]


def _identity(start, end):
    return start, end


@pytest.mark.parametrize("word, score", [
    (_word(0.0, 0.5), 0.0),
    (_word(0.0, 0.5, probability=0.1), 1.0),
    (_word(0.0, 0.033), 1.5),                     # (0.133 - 0.033) * 15
    (_word(0.0, 3.0), 1.0),                       # 3.0 - 2.0
    (_word(0.0, 2.5, probability=0.1), 1.5),
])
def test_word_anomaly_score(word, score):
    assert word_anomaly_score(word) == pytest.approx(score)


def test_segment_anomaly():
    assert not is_segment_anomaly(None) and not is_segment_anomaly([])
    assert not is_segment_anomaly(_speech(0.0, 2.0, count=5))
    assert is_segment_anomaly([_word(0.0, 0.3, 0.1), _word(0.3, 0.6, 0.1)])   # 2 + 0.01 >= 2 words
    assert not is_segment_anomaly([_word(0.0, 0.3, 0.1), _word(0.3, 0.6), _word(0.6, 0.9)])  # 1 of 3
    # punctuation is not scored: one good word left (with it: 2.845 + 0.01 >= 2 words)
    assert not is_segment_anomaly([_word(0.0, 0.3, text=" a"), _word(0.3, 0.31, 0.01, text="?")])
    # only the first eight words count: eight good words, then improbable ones
    assert not is_segment_anomaly(_speech(0.0, 4.0, count=8) + [_word(4.0, 4.3, 0.01)] * 4)


def _segments(*words):
    return list(words)


def test_anomaly_between_silences_is_dropped():
    words = _segments(_speech(0.5, 3.0), [_word(10.0, 11.0, 0.05)], _speech(20.0, 25.0))
    assert hallucinated_segments(words, _identity, 30.0, threshold=2.0) == {1}
    assert hallucinated_segments(words, _identity, 30.0, threshold=8.0) == set()  # 7 s before: too short


def test_leading_anomaly_after_silence_is_dropped():
    words = _segments([_word(5.0, 6.0, 0.05)], _speech(6.2, 9.0))
    assert hallucinated_segments(words, _identity, 30.0, threshold=2.0) == {0}
    words = _segments([_word(1.0, 1.3, 0.05)], _speech(1.5, 4.0))   # 1 s in: not after silence
    assert hallucinated_segments(words, _identity, 30.0, threshold=2.0) == set()


def test_consecutive_anomalies_and_the_window_end():
    words = _segments(_speech(0.5, 3.0), [_word(10.0, 11.0, 0.05)], [_word(11.2, 12.0, 0.05)])
    # the first has an anomaly after it; the second ends more than 2 s before the window's end but with nothing
    # after it the window's end (30 s) is the next start: 18 s of silence
    assert hallucinated_segments(words, _identity, 30.0, threshold=2.0) == {1, 2}
    words = _segments(_speech(0.5, 3.0), [_word(28.5, 29.0, 0.05)])
    assert hallucinated_segments(words, _identity, 30.0, threshold=30.0) == {1}  # starts before 30 s
    later = (lambda start, end: (start + 100, end + 100))  # the same window 100 s into the input
    assert hallucinated_segments(words, later, 30.0, threshold=30.0) == set()  # 25.5 s before < 30
    words = _segments(_speech(0.5, 27.0, count=20), [_word(28.5, 29.0, 0.05)])
    assert hallucinated_segments(words, _identity, 30.0, threshold=1.0) == {1}
    assert hallucinated_segments(words, _identity, 30.0, threshold=2.0) == set()


def test_silence_is_measured_on_the_input_timeline():
    """A packed window (VAD): window 0-5 s is input 100-105 s, window 5-30 s is input 140-165 s."""
    def packed(start, end):
        return tuple(100 + t if t <= 5 else 135 + t for t in (start, end))

    words = _segments(_speech(1.0, 4.5), [_word(5.5, 6.0, 0.05)], _speech(9.5, 12.0))
    assert hallucinated_segments(words, packed, 30.0, threshold=3.0) == {1}
    assert hallucinated_segments(words, _identity, 30.0, threshold=3.0) == set()


def test_drop_segments_removes_only_their_text():
    def is_timestamp(token):
        return token >= 1000

    def is_text(token):
        return token < 900

    tokens = [1000, 1, 2, 1010, 1012, 3, 4, 1020, 1022, 950, 5, 1030]
    assert drop_segments(tokens, is_timestamp, is_text, {1}) == [1000, 1, 2, 1010, 1012, 1020, 1022, 950, 5, 1030]
    assert drop_segments(tokens, is_timestamp, is_text, {0, 2}) == [1000, 1010, 1012, 3, 4, 1020, 1022, 950, 1030]
    assert drop_segments([1, 2, 3], is_timestamp, is_text, {0}) == []
    assert drop_segments(tokens, is_timestamp, is_text, set()) == tokens


# ---------------------------------------------------------------------------------------------- with the model
@pytest.fixture(scope="module")
def silence_then_speech():
    import os

    import numpy as np
    from conftest import require_speech_clips

    from seq2seq_engine.audio import load_audio
    fox = load_audio(os.path.join(require_speech_clips(), "en/quick_brown_fox.wav"))
    hiss = 0.003 * np.random.default_rng(0).standard_normal(10 * 16000)
    return np.concatenate([hiss, fox]).astype(np.float32)


def _transcribe(llm, audio, **options):
    return llm.transcribe([audio], timestamps=True, vad_filter=False, use_tqdm=False, **options)[0]


@pytest.mark.usefixtures("no_leaked_blocks")
def test_text_forced_over_silence_is_dropped(tiny_llm, silence_then_speech):
    """A prefix the audio does not say, over 10 s of hiss, reads as a hallucination (improbable words, then
    silence); the speech after it stays, with the same segments as without the rule."""
    plain = _transcribe(tiny_llm, silence_then_speech, word_timestamps=True)
    forced = _transcribe(tiny_llm, silence_then_speech, word_timestamps=True, prefix="Banana pancakes with syrup.")
    assert forced.text.startswith("Banana pancakes with syrup.")
    kept = _transcribe(tiny_llm, silence_then_speech, word_timestamps=True, prefix="Banana pancakes with syrup.",
                       hallucination_silence_threshold=2.0)
    assert kept.text == forced.segments[1].text == plain.text
    assert [(s.start, s.end, s.text) for s in kept.segments] == [(s.start, s.end, s.text) for s in forced.segments[1:]]
    assert [w.word for w in kept.segments[0].words] == [w.word for w in forced.segments[1].words]
    longer = _transcribe(tiny_llm, silence_then_speech, prefix="Banana pancakes with syrup.",
                         hallucination_silence_threshold=9.5)   # the gap after it is about 8.8 s
    assert longer.text == forced.text and longer.segments[0].words is None   # words timed, not returned


@pytest.mark.usefixtures("no_leaked_blocks")
def test_real_speech_is_kept(tiny_llm, silence_then_speech):
    plain = _transcribe(tiny_llm, silence_then_speech, condition_on_previous_text=True)
    checked = _transcribe(tiny_llm, silence_then_speech, condition_on_previous_text=True,
                          hallucination_silence_threshold=1.0)
    assert checked.text == plain.text and checked.text.startswith("The quick brown fox")
    assert [(s.start, s.end) for s in checked.segments] == [(s.start, s.end) for s in plain.segments]


def test_cli_flag_reaches_the_options():
    import argparse

    from seq2seq_engine.entrypoints import transcribe_cli
    from seq2seq_engine.entrypoints.transcribe_flags import options_from_args
    parser = transcribe_cli.configure_parser(argparse.ArgumentParser())
    args = parser.parse_args(["a.wav", "--hallucination-silence-threshold", "2.5"])
    assert options_from_args(args).hallucination_silence_threshold == 2.5
    assert options_from_args(parser.parse_args(["a.wav"])).hallucination_silence_threshold is None
