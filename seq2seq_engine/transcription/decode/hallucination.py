"""`hallucination_silence_threshold`: which of a window's timed segments are hallucinations surrounded by silence.

openai-whisper's rule, on word timings: a segment is anomalous when its first eight non-punctuation words score
high (improbable, very short or very long words); an anomalous segment with silence (a gap longer than the
threshold, another anomalous segment, or the window's edge within 2 s) on both sides is dropped, and so is a first
segment that is anomalous and starts more than the threshold into the window. The times are
the input's (through a packed window's time map), so the silence VAD removed counts as silence.
"""
from __future__ import annotations

from typing import Callable, List, Optional, Sequence, Set, Tuple

from seq2seq_engine.transcription.timing.words import APPEND_PUNCTUATIONS, PREPEND_PUNCTUATIONS, WordTiming

_PUNCTUATION = PREPEND_PUNCTUATIONS + APPEND_PUNCTUATIONS  # matched as a substring, as openai-whisper does
_EDGE_SECONDS = 2.0          # openai-whisper: a segment this close to the window's edge has silence on that side
_SCORED_WORDS = 8
_LOW_PROBABILITY = 0.15
_SHORT_WORD, _SHORT_WORD_WEIGHT = 0.133, 15.0
_LONG_WORD = 2.0

Span = Callable[[float, float], Tuple[float, float]]  # window seconds -> the input's (start, end)


def word_anomaly_score(word: WordTiming) -> float:
    """How unlike real speech one timed word is: improbable, shorter than 0.133 s or longer than 2 s."""
    duration = word.end - word.start
    score = 1.0 if word.probability < _LOW_PROBABILITY else 0.0
    if duration < _SHORT_WORD:
        score += (_SHORT_WORD - duration) * _SHORT_WORD_WEIGHT
    if duration > _LONG_WORD:
        score += duration - _LONG_WORD
    return score


def is_segment_anomaly(words: Optional[Sequence[WordTiming]]) -> bool:
    """True when the segment's first eight non-punctuation words score at least 3, or about 1 per word."""
    if not words:
        return False
    scored = [word for word in words if word.word not in _PUNCTUATION][:_SCORED_WORDS]
    score = sum(word_anomaly_score(word) for word in scored)
    return score >= 3 or score + 0.01 >= len(scored)


def hallucinated_segments(words: Sequence[List[WordTiming]], span: Span, window_duration: float,
                          threshold: float) -> Set[int]:
    """Indices of the segments to drop. `words` are each segment's timed words (window seconds; a segment spans
    its words, as openai-whisper moves segment times to the words), `span` maps window seconds to the input's."""
    window_start, window_end = span(0.0, window_duration)
    input_words = [[WordTiming(w.word, w.tokens, *span(w.start, w.end), w.probability) for w in segment]
                   for segment in words]
    dropped: Set[int] = set()
    speech_end = window_start  # the end of the last segment kept as speech
    first = next((index for index, segment in enumerate(input_words) if segment), None)
    for index, segment_words in enumerate(input_words):
        if not segment_words:
            continue
        start, end = segment_words[0].start, segment_words[-1].end
        if is_segment_anomaly(segment_words):
            if index == first and start - window_start > threshold:
                dropped.add(index)  # leading silence, then a probable hallucination
                continue
            following = next((later for later in input_words[index + 1:] if later), None)
            next_start = following[0].start if following else window_end
            silence_before = (start - speech_end > threshold or start < threshold
                              or start - window_start < _EDGE_SECONDS)
            silence_after = (next_start - end > threshold or is_segment_anomaly(following)
                             or window_end - end < _EDGE_SECONDS)
            if silence_before and silence_after:
                dropped.add(index)
                continue
        speech_end = end
    return dropped


def drop_segments(token_ids: Sequence[int], is_timestamp: Callable[[int], bool], is_text: Callable[[int], bool],
                  dropped: Set[int]) -> List[int]:
    """`token_ids` without the text tokens of the dropped segments (segment k: the k-th run of text tokens between
    timestamps, as split_segments counts them); timestamps and other tokens stay."""
    kept: List[int] = []
    segment, in_text = 0, False
    for token in token_ids:
        if is_timestamp(token):
            if in_text:
                segment, in_text = segment + 1, False
            kept.append(token)
        elif is_text(token):
            in_text = True
            if segment not in dropped:
                kept.append(token)
        else:
            kept.append(token)
    return kept
