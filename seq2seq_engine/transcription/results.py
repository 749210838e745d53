"""What `transcribe` returns per input, and its txt / json / srt / vtt renderings."""
from __future__ import annotations

import dataclasses
import json
from typing import Any, Dict, List, Optional

OUTPUT_FORMATS = ("txt", "json", "srt", "vtt")


@dataclasses.dataclass
class Segment:
    """A stretch of the transcript, in seconds from the start of the input, with the scores of the decoding that
    made it (openai-whisper's verbose_json fields; None where the window was not decoded): `temperature` of the kept
    attempt, `avg_logprob` of its tokens, `compression_ratio` of its text, `no_speech_prob`. Segments compare equal
    by span and text (the scores are floats of one particular decoding)."""

    start: float
    end: float
    text: str
    temperature: Optional[float] = dataclasses.field(default=None, compare=False)
    avg_logprob: Optional[float] = dataclasses.field(default=None, compare=False)
    compression_ratio: Optional[float] = dataclasses.field(default=None, compare=False)
    no_speech_prob: Optional[float] = dataclasses.field(default=None, compare=False)

    def to_dict(self) -> Dict[str, Any]:
        return {"start": round(self.start, 3), "end": round(self.end, 3), "text": self.text,
                "temperature": self.temperature, "avg_logprob": self.avg_logprob,
                "compression_ratio": self.compression_ratio, "no_speech_prob": self.no_speech_prob}


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


def to_srt(result: TranscriptionResult) -> str:
    cues = []
    for segment in result.segments:
        text = _cue_text(segment.text)
        if not text:
            continue
        cues.append(f"{len(cues) + 1}\n{format_timestamp(segment.start, ',')} --> "
                    f"{format_timestamp(segment.end, ',')}\n{text}\n")
    return "\n".join(cues)


def to_vtt(result: TranscriptionResult) -> str:
    cues = ["WEBVTT\n"]
    for segment in result.segments:
        text = _cue_text(segment.text)
        if text:
            cues.append(f"{format_timestamp(segment.start)} --> {format_timestamp(segment.end)}\n{text}\n")
    return "\n".join(cues)


def to_txt(result: TranscriptionResult) -> str:
    return result.text + "\n"


def to_json(result: TranscriptionResult) -> str:
    return json.dumps(result.to_dict(), ensure_ascii=False, indent=2) + "\n"


def render(result: TranscriptionResult, output_format: str) -> str:
    """The result as one of OUTPUT_FORMATS."""
    renderers = {"txt": to_txt, "json": to_json, "srt": to_srt, "vtt": to_vtt}
    if output_format not in renderers:
        raise ValueError(f"output format must be one of {OUTPUT_FORMATS}, got {output_format!r}")
    return renderers[output_format](result)
