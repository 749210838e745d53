"""What `transcribe` returns per input, and its txt / json / srt / vtt renderings."""
from __future__ import annotations

import dataclasses
import enum
import json
from typing import Any, Dict, List, Optional, Union

from seq2seq_engine.transcription.output.cue_timing import to_milliseconds
from seq2seq_engine.transcription.output.subtitles import Cue, SubtitleOptions, subtitle_cues, subtitle_options

OUTPUT_FORMATS = ("txt", "json", "srt", "vtt")


class FailureKind(enum.Enum):
    """Why an input has no transcript (TranscriptionResult.failure): what a caller branches on, `error` says it."""

    AUDIO = "audio"                    # its audio cannot be read or used
    AUDIO_TOO_LONG = "audio_too_long"  # its audio lasts longer than max_audio_seconds (decoded no further)
    ENGINE = "engine"                  # the engine refused, ignored or failed one of its requests


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
    the language was given or the model is English-only); failure: the kind of failure when `error` is set.
    """

    text: str
    language: Optional[str]
    segments: List[Segment]
    error: Optional[str]
    duration: float
    language_probability: Optional[float] = None
    source: Optional[str] = None
    failure: Optional[FailureKind] = None

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
    hours, milliseconds = divmod(to_milliseconds(seconds), 3_600_000)
    minutes, milliseconds = divmod(milliseconds, 60_000)
    secs, milliseconds = divmod(milliseconds, 1_000)
    hours_part = f"{hours:02d}:" if always_include_hours or hours > 0 else ""
    return f"{hours_part}{minutes:02d}:{secs:02d}{decimal_marker}{milliseconds:03d}"


def _cues(result: TranscriptionResult, subtitles: Any, fields: Dict[str, Any]) -> List[Cue]:
    return subtitle_cues(result.segments, subtitle_options(subtitles, **fields))


def to_srt(result: TranscriptionResult, subtitles: Union[SubtitleOptions, int, None] = None, **fields: Any) -> str:
    """The result as SubRip subtitles; subtitles: SubtitleOptions (or an int: max_words_per_line), `fields`
    replacing some of its fields (subtitles.py: how cues are cut)."""
    return "\n".join(f"{number}\n{format_timestamp(cue.start, ',')} --> {format_timestamp(cue.end, ',')}\n{cue.text}\n"
                     for number, cue in enumerate(_cues(result, subtitles, fields), 1))


def to_vtt(result: TranscriptionResult, subtitles: Union[SubtitleOptions, int, None] = None, **fields: Any) -> str:
    """The result as WebVTT subtitles; the options as to_srt's."""
    cues = ["WEBVTT\n"] + [f"{format_timestamp(cue.start)} --> {format_timestamp(cue.end)}\n{cue.text}\n"
                           for cue in _cues(result, subtitles, fields)]
    return "\n".join(cues)


def to_txt(result: TranscriptionResult) -> str:
    return result.text + "\n"


def to_json(result: TranscriptionResult) -> str:
    return json.dumps(result.to_dict(), ensure_ascii=False, indent=2) + "\n"


def render(result: TranscriptionResult, output_format: str, subtitles: Union[SubtitleOptions, int, None] = None,
           **fields: Any) -> str:
    """The result as one of OUTPUT_FORMATS. srt/vtt: cues cut by `subtitles` (SubtitleOptions, or an int:
    max_words_per_line) with `fields` (SubtitleOptions fields, e.g. max_line_width=32) replacing some of them;
    txt and json ignore them (json keeps the decoder's segments as they are)."""
    if output_format not in OUTPUT_FORMATS:
        raise ValueError(f"output format must be one of {OUTPUT_FORMATS}, got {output_format!r}")
    if output_format == "srt":
        return to_srt(result, subtitles, **fields)
    if output_format == "vtt":
        return to_vtt(result, subtitles, **fields)
    return to_txt(result) if output_format == "txt" else to_json(result)
