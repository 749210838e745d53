"""The events a live transcription emits, one frozen dataclass each (the WebSocket endpoint maps them to OpenAI's)."""
from __future__ import annotations

import dataclasses
from typing import Optional, Union


@dataclasses.dataclass(frozen=True)
class SpeechStarted:
    """The VAD heard speech: a new item (turn) begins; audio_start_ms counts from the first sample appended and
    includes the prefix padding."""

    item_id: str
    audio_start_ms: int


@dataclasses.dataclass(frozen=True)
class SpeechStopped:
    """The turn's speech ended: audio_end_ms is where the silence reached silence_duration_ms."""

    item_id: str
    audio_end_ms: int


@dataclasses.dataclass(frozen=True)
class Committed:
    """The turn's audio is final and its last decode is under way; previous_item_id is the item committed before."""

    item_id: str
    previous_item_id: Optional[str]


@dataclasses.dataclass(frozen=True)
class Cleared:
    """The uncommitted audio was dropped."""


@dataclasses.dataclass(frozen=True)
class Delta:
    """New text of the item: words two consecutive hypotheses agree on (or the final decode's rest), never retracted;
    the deltas of an item concatenate (the first without a leading space, the next ones with one)."""

    item_id: str
    text: str


@dataclasses.dataclass(frozen=True)
class Completed:
    """The item's transcript: its final decode's text (whitespace collapsed); audio_seconds is the turn's length."""

    item_id: str
    transcript: str
    audio_seconds: float


LiveEvent = Union[SpeechStarted, SpeechStopped, Committed, Cleared, Delta, Completed]
