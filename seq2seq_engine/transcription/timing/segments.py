"""From the tokens generated for each 30 s window to one input's text and segments.

A window's tokens with timestamps look like `<|0.00|> Hello<|1.20|><|1.40|> world.<|2.00|>`: text between an
opening and a closing timestamp is a segment; consecutive timestamps close one segment and open the next; a final
single timestamp (right before `<|endoftext|>`) closes the last. Text left open at the end of a window (the
window cut mid-sentence, or max_new_tokens ran out) ends at the window's end. Times are relative to the window
and shifted by its offset in the input (or, for a window of packed speech regions, mapped through its TimeMap,
vad_windows.py); they are clamped to the window's audio and rounded to the microsecond.
"""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Callable, List, Optional, Sequence, Tuple

from seq2seq_engine.transcription.output.results import Segment, Word
from seq2seq_engine.transcription.prompts import TIME_PRECISION, WhisperTokens

if TYPE_CHECKING:
    from seq2seq_engine.transcription.input.vad_windows import TimeMap
    from seq2seq_engine.transcription.timing.words import WordTiming

RawSegment = Tuple[float, float, List[int]]  # (start s, end s, text token ids), relative to the window
SCORE_FIELDS = ("temperature", "avg_logprob", "compression_ratio", "no_speech_prob")


@dataclasses.dataclass
class WindowTokens:
    """What one window produced: its offset and length in the input (seconds), its tokens (without
    `<|endoftext|>`) and, when it was decoded, the kept attempt's scores (see fallback.py)."""

    offset: float
    duration: float
    token_ids: List[int]
    time_map: Optional["TimeMap"] = None  # a window of speech regions (vad_filter): maps its times to the input's
    temperature: Optional[float] = None
    avg_logprob: Optional[float] = None
    compression_ratio: Optional[float] = None
    no_speech_prob: Optional[float] = None
    words: Optional[List[List["WordTiming"]]] = None  # timed words: per split_segments segment, window times
    show_words: bool = True   # False: timed only to split segments at the splices of a packed window (not output)

    def scores(self) -> dict:
        return {name: getattr(self, name) for name in SCORE_FIELDS}

    def input_span(self, start: float, end: float) -> Tuple[float, float]:
        """The input's (start, end) of a segment `start`..`end` seconds into the window, rounded to the microsecond
        (shifted by the offset, or placed by the time map: TimeMap.span)."""
        if self.time_map is not None:
            start, end = self.time_map.span(start, end)
            return round(start, 6), round(end, 6)
        return round(self.offset + start, 6), round(self.offset + end, 6)

    def input_words(self, index: Optional[int] = None) -> Optional[List[Word]]:
        """The timed words of segment `index` (all the window's with None) on the input's timeline (input_span,
        so through the time map of a packed window), or None without word timestamps."""
        if self.words is None or not self.show_words:
            return None
        timings = [w for segment in self.words for w in segment] if index is None else self.words[index]
        return [Word(*self.input_span(w.start, w.end), w.word, w.probability) for w in timings]


def split_segments(token_ids: Sequence[int], tokens: WhisperTokens, window_duration: float,
                   time_precision: float = TIME_PRECISION) -> List[RawSegment]:
    """Segments of one window's generated tokens, times relative to the window (see the module docstring).

    Special tokens other than timestamps are ignored; segments without text are dropped.
    """
    segments: List[RawSegment] = []
    start = None          # time of the open segment's opening timestamp
    last_end = 0.0        # where text with no opening timestamp starts
    text: List[int] = []
    for token in token_ids:
        if tokens.is_timestamp(token):
            time = min(round((token - tokens.timestamp_begin) * time_precision, 6), window_duration)
            if text:
                begin = last_end if start is None else start
                segments.append((begin, max(time, begin), text))
                last_end, start, text = time, None, []
            else:
                start = time  # an opening timestamp (a later one replaces an earlier, empty opening)
        elif tokens.is_text(token):
            text.append(int(token))
    if text:
        begin = last_end if start is None else start
        segments.append((begin, max(window_duration, begin), text))
    return segments


def stitch(windows: Sequence[WindowTokens], tokens: WhisperTokens, decode: Callable[[List[int]], str],
           timestamps: bool) -> Tuple[str, List[Segment]]:
    """One input's (text, segments) from its windows, in order.

    With timestamps, each window's segments are shifted by the window's offset (placed by its time map when it
    has one); without, each window that has text is one segment spanning the window (from its first region's
    start to its last region's end). The text is the windows' texts joined (Whisper's text tokens carry
    their leading spaces), stripped; each segment's text is stripped.
    """
    pieces, segments = pieces_and_segments(windows, tokens, decode, timestamps)
    return "".join(pieces).strip(), segments


def pieces_and_segments(windows: Sequence[WindowTokens], tokens: WhisperTokens, decode: Callable[[List[int]], str],
                        timestamps: bool) -> Tuple[List[str], List[Segment]]:
    """The windows' text pieces (unstripped: joined, they are the text) and segments, as `stitch` makes them."""
    segments: List[Segment] = []
    pieces: List[str] = []
    for window in windows:
        if timestamps:
            for index, (start, end, text_ids) in enumerate(split_segments(window.token_ids, tokens, window.duration)):
                text = decode(text_ids)
                pieces.append(text)
                if text.strip():
                    segments += _timed_segments(window, index, start, end, text)
        else:
            text = decode([t for t in window.token_ids if tokens.is_text(t)])
            pieces.append(text)
            if text.strip() and window.time_map is not None:
                segments.append(Segment(window.time_map.to_original(0.0),
                                        window.time_map.to_original(window.duration, is_end=True), text.strip(),
                                        **window.scores(), words=window.input_words()))
            elif text.strip():
                segments.append(Segment(window.offset, window.offset + window.duration, text.strip(),
                                        **window.scores(), words=window.input_words()))
    return pieces, segments


def _timed_segments(window: WindowTokens, index: int, start: float, end: float, text: str) -> List[Segment]:
    """Segment `index` of a window (`start`..`end` seconds into it) on the input's timeline. In a packed window,
    one whose timed words fall in several speech pieces (TimeMap.piece_of) becomes one segment per piece, of its
    words there: placed whole in one piece, the text of the others would be timed where it was not said."""
    timings = window.words[index] if window.words is not None else None
    groups = _words_by_piece(window, timings) if window.time_map is not None and timings else []
    if len(groups) < 2:
        return [Segment(*window.input_span(start, end), text.strip(), **window.scores(),
                        words=window.input_words(index))]
    return [Segment(group[0].start, group[-1].end, "".join(w.word for w in group).strip(), **window.scores(),
                    words=group if window.show_words else None) for group in groups]


def _words_by_piece(window: WindowTokens, timings: Sequence["WordTiming"]) -> List[List[Word]]:
    """The words on the input's timeline, in runs of consecutive words in the same piece of the window."""
    groups: List[List[Word]] = []
    last_piece = None
    for timing in timings:
        piece = window.time_map.piece_of(timing.start, timing.end)
        if piece != last_piece:
            groups.append([])
            last_piece = piece
        groups[-1].append(Word(*window.input_span(timing.start, timing.end), timing.word, timing.probability))
    return groups
