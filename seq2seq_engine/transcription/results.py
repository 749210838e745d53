"""What `transcribe` returns per input, and its txt / json / srt / vtt renderings."""
from __future__ import annotations

import dataclasses
import json
from typing import Any, Dict, List, Optional, Tuple

OUTPUT_FORMATS = ("txt", "json", "srt", "vtt")


@dataclasses.dataclass
class Word:
    """One timed word (word_timestamps=True): seconds from the start of the input; `word` keeps its leading
    space and merged punctuation; probability: mean probability of its tokens."""

    start: float
    end: float
    word: str
    probability: float

    def to_dict(self) -> Dict[str, Any]:
        return {"start": round(self.start, 3), "end": round(self.end, 3), "word": self.word,
                "probability": round(self.probability, 4)}


@dataclasses.dataclass
class Segment:
    """A stretch of the transcript, in seconds from the start of the input, with the scores of the decoding that
    made it (openai-whisper's verbose_json fields; None where the window was not decoded): `temperature` of the kept
    attempt, `avg_logprob` of its tokens, `compression_ratio` of its text, `no_speech_prob`. Segments compare equal
    by span and text (the scores are floats of one particular decoding). words: its timed words when word timestamps
    were asked for, else None."""

    start: float
    end: float
    text: str
    temperature: Optional[float] = dataclasses.field(default=None, compare=False)
    avg_logprob: Optional[float] = dataclasses.field(default=None, compare=False)
    compression_ratio: Optional[float] = dataclasses.field(default=None, compare=False)
    no_speech_prob: Optional[float] = dataclasses.field(default=None, compare=False)
    words: Optional[List[Word]] = dataclasses.field(default=None, compare=False)

    def to_dict(self) -> Dict[str, Any]:
        data: Dict[str, Any] = {"start": round(self.start, 3), "end": round(self.end, 3), "text": self.text,
                                "temperature": self.temperature, "avg_logprob": self.avg_logprob,
                                "compression_ratio": self.compression_ratio, "no_speech_prob": self.no_speech_prob}
        if self.words is not None:
            data["words"] = [word.to_dict() for word in self.words]
        return data


@dataclasses.dataclass
class TranscriptionResult:
    """One input's transcript.

    text: the whole transcript (windows joined); language: the language code used ("en", "de", ...; detected
    when none was given); segments: with timestamps on, one per timestamp pair, else one per 30 s window that
    has text; error: why this input failed (then text is "" and segments empty), else None; duration: seconds
    of audio (0.0 when the input could not be read); language_probability: of the detected language (None when
    the language was given or the model is English-only).
    """

    text: str
    language: Optional[str]
    segments: List[Segment]
    error: Optional[str]
    duration: float
    language_probability: Optional[float] = None
    source: Optional[str] = None

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_dict(self) -> Dict[str, Any]:
        return {"source": self.source, "text": self.text, "language": self.language,
                "language_probability": self.language_probability, "duration": round(self.duration, 3),
                "segments": [segment.to_dict() for segment in self.segments], "error": self.error}


def format_timestamp(seconds: float, decimal_marker: str = ".", always_include_hours: bool = True) -> str:
    """`HH:MM:SS.mmm` (vtt) or `HH:MM:SS,mmm` (srt, decimal_marker=","), rounded to the millisecond."""
    if seconds < 0:
        raise ValueError(f"a timestamp cannot be negative, got {seconds}")
    milliseconds = int(round(seconds * 1000.0))
    hours, milliseconds = divmod(milliseconds, 3_600_000)
    minutes, milliseconds = divmod(milliseconds, 60_000)
    secs, milliseconds = divmod(milliseconds, 1_000)
    hours_part = f"{hours:02d}:" if always_include_hours or hours > 0 else ""
    return f"{hours_part}{minutes:02d}:{secs:02d}{decimal_marker}{milliseconds:03d}"


def _cue_text(text: str) -> str:
    # A blank line ends a cue in both formats; "-->" would be read as a timing line in vtt.
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return "\n".join(lines).replace("-->", "->")


def _cues(result: TranscriptionResult, max_words_per_line: Optional[int]) -> List[Tuple[float, float, str]]:
    """(start, end, text) per subtitle cue: one per segment, or with max_words_per_line and word timestamps,
    one per run of at most that many words of a segment (timed from its first word's start to its last's end)."""
    if max_words_per_line is not None and max_words_per_line < 1:
        raise ValueError(f"max_words_per_line must be a positive int or None, got {max_words_per_line!r}")
    cues = []
    for segment in result.segments:
        if max_words_per_line is None or not segment.words:
            cues.append((segment.start, segment.end, _cue_text(segment.text)))
            continue
        for first in range(0, len(segment.words), max_words_per_line):
            line = segment.words[first:first + max_words_per_line]
            cues.append((line[0].start, line[-1].end, _cue_text("".join(word.word for word in line))))
    return [cue for cue in cues if cue[2]]


def to_srt(result: TranscriptionResult, max_words_per_line: Optional[int] = None) -> str:
    return "\n".join(f"{number}\n{format_timestamp(start, ',')} --> {format_timestamp(end, ',')}\n{text}\n"
                     for number, (start, end, text) in enumerate(_cues(result, max_words_per_line), 1))


def to_vtt(result: TranscriptionResult, max_words_per_line: Optional[int] = None) -> str:
    cues = ["WEBVTT\n"] + [f"{format_timestamp(start)} --> {format_timestamp(end)}\n{text}\n"
                           for start, end, text in _cues(result, max_words_per_line)]
    return "\n".join(cues)


def to_txt(result: TranscriptionResult) -> str:
    return result.text + "\n"


def to_json(result: TranscriptionResult) -> str:
    return json.dumps(result.to_dict(), ensure_ascii=False, indent=2) + "\n"


def render(result: TranscriptionResult, output_format: str, max_words_per_line: Optional[int] = None) -> str:
    """The result as one of OUTPUT_FORMATS; max_words_per_line: srt/vtt cues of at most that many words (needs
    word timestamps; segments without words keep one cue)."""
    renderers = {"txt": to_txt, "json": to_json, "srt": to_srt, "vtt": to_vtt}
    if output_format not in renderers:
        raise ValueError(f"output format must be one of {OUTPUT_FORMATS}, got {output_format!r}")
    if output_format in ("srt", "vtt"):
        return renderers[output_format](result, max_words_per_line)
    return renderers[output_format](result)
