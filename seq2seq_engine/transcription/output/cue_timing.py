"""Cue times srt and vtt can show: whole milliseconds, every cue lasting at least MIN_CUE_SECONDS (taken from the
silence after it, else from the cues after it) and ending no later than the next cue starts."""
from __future__ import annotations

import dataclasses
import math
from typing import List, Sequence

# Whisper times words in steps of its 20 ms encoder frames: a word timed start == end was shorter than one frame.
MIN_CUE_SECONDS = 0.02


@dataclasses.dataclass(frozen=True)
class Cue:
    """One subtitle, shown from start to end (seconds)."""

    start: float
    end: float
    text: str  # its lines joined by "\n"


def to_milliseconds(seconds: float) -> int:
    """`seconds` rounded to the millisecond, as srt and vtt write them (results.format_timestamp)."""
    return int(round(seconds * 1000.0))


def shown_times(cues: Sequence[Cue], max_seconds: float) -> List[Cue]:
    """The cues, in their order, on whole milliseconds. Each starts when it did, or when the cue before it ends if
    that is later; it ends when it did, cut back to the next cue's start and to max_seconds after its own start, but
    lasts at least MIN_CUE_SECONDS (or max_seconds if shorter). A cue lengthened past the next cue's start delays
    that one (which keeps the same minimum), so a run of zero-length words shows each for MIN_CUE_SECONDS."""
    longest = max(1, math.floor(max_seconds * 1000.0))
    shortest = min(to_milliseconds(MIN_CUE_SECONDS), longest)
    next_starts = [to_milliseconds(cue.start) for cue in cues[1:]] + [math.inf]
    shown: List[Cue] = []
    shown_until = -math.inf
    for cue, next_start in zip(cues, next_starts):
        start = max(to_milliseconds(cue.start), shown_until)
        end = max(start + shortest, min(to_milliseconds(cue.end), next_start, start + longest))
        shown.append(dataclasses.replace(cue, start=start / 1000.0, end=end / 1000.0))
        shown_until = end
    return shown
