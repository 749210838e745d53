"""The events a live transcription emits, one frozen dataclass each (the WebSocket endpoint maps them to OpenAI's)."""
from __future__ import annotations

import dataclasses
from typing import List, Optional, Union

from seq2seq_engine.audio import SAMPLE_RATE
from seq2seq_engine.transcription.live.turn import Turn


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


def audio_ms(sample: int) -> int:
    """Milliseconds of stream audio before `sample`."""
    return sample * 1000 // SAMPLE_RATE


def delta_events(turn: Turn, new: List[str]) -> List["LiveEvent"]:
    """A Delta of the turn's newly agreed words, if any."""
    return [Delta(turn.item_id, turn.agreement.delta_text(new))] if new else []


def completed_events(turns: List[Turn]) -> List["LiveEvent"]:
    """Completed for each finished turn at the front of `turns` (the committed ones, in commit order; each is taken
    off the list), each after the Delta of its words beyond the deltas sent."""
    events: List[LiveEvent] = []
    while turns and turns[0].done:
        turn = turns.pop(0)
        events += delta_events(turn, turn.agreement.confirm(turn.words))
        audio_seconds = (turn.end - turn.start) / SAMPLE_RATE
        events.append(Completed(turn.item_id, " ".join(turn.words), audio_seconds))
    return events
