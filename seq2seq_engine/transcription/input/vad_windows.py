"""Speech regions packed into 30 s windows, and the map from a window's time back to the recording's."""
from __future__ import annotations

import bisect
import dataclasses
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np

from seq2seq_engine.audio import SAMPLE_RATE
from seq2seq_engine.audio.silero import model_path
from seq2seq_engine.audio.vad import Region, VadOptions, speech_regions


class TimeMap:
    """Converts a time in a packed window (seconds from its start) to the recording's time, piecewise.

    The window is `regions` of the recording laid end to end in order; regions that touch in the recording (one
    ends where the next starts) are one piece. A time inside piece k's stretch of the window maps to piece k's
    start plus the time into it. A time on the boundary between two pieces is the start of the later one, or the
    end of the earlier one with `is_end=True`. Times are clamped to the window. `span` places a segment.
    """

    def __init__(self, regions: Sequence[Region], sample_rate: int = SAMPLE_RATE) -> None:
        if not regions:
            raise ValueError("a time map needs at least one region")
        self.regions: List[Region] = []
        for start, end in regions:
            if end <= start or (self.regions and start < self.regions[-1][1]):
                raise ValueError(f"regions must be ordered, non-overlapping and non-empty, got {list(regions)}")
            if self.regions and start == self.regions[-1][1]:
                self.regions[-1] = (self.regions[-1][0], int(end))
            else:
                self.regions.append((int(start), int(end)))
        self.sample_rate = sample_rate
        self.window_starts: List[int] = []  # where each piece begins in the window, in samples
        self.window_ends: List[int] = []
        position = 0
        for start, end in self.regions:
            self.window_starts.append(position)
            position += end - start
            self.window_ends.append(position)

    @property
    def num_samples(self) -> int:
        return self.window_ends[-1]

    @property
    def duration(self) -> float:
        return self.num_samples / self.sample_rate

    @property
    def start_sample(self) -> int:
        """The recording's sample at the start of the window."""
        return self.regions[0][0]

    def region_index(self, time: float, is_end: bool = False) -> int:
        """Which region a window time falls in (see the class docstring for boundaries)."""
        sample = min(max(time * self.sample_rate, 0.0), float(self.num_samples))
        if is_end:
            return min(bisect.bisect_left(self.window_ends, sample), len(self.regions) - 1)
        return max(bisect.bisect_right(self.window_starts, sample) - 1, 0)

    def to_original(self, time: float, is_end: bool = False) -> float:
        """The recording's time (seconds) of `time` seconds into the window."""
        sample = min(max(time * self.sample_rate, 0.0), float(self.num_samples))
        k = self.region_index(time, is_end)
        return (self.regions[k][0] + sample - self.window_starts[k]) / self.sample_rate

    def _bounds(self, start: float, end: float) -> Tuple[float, float]:
        """`start`..`end` seconds into the window as samples, clamped to the window (end not before start)."""
        a = min(max(start * self.sample_rate, 0.0), float(self.num_samples))
        return a, min(max(end * self.sample_rate, a), float(self.num_samples))

    def _overlaps(self, a: float, b: float) -> List[float]:
        """Samples of a..b inside each piece (<= 0 where they do not meet)."""
        return [min(b, e) - max(a, s) for s, e in zip(self.window_starts, self.window_ends)]

    def piece_of(self, start: float, end: float) -> int:
        """The piece holding the largest part of `start`..`end` seconds into the window (the earliest on a tie)."""
        overlaps = self._overlaps(*self._bounds(start, end))
        best = max(overlaps)
        return overlaps.index(best) if best > 0 else self.region_index(start)

    def pieces_covered(self, start: float, end: float, min_seconds: float) -> int:
        """How many pieces `start`..`end` seconds into the window overlaps by more than `min_seconds`."""
        least = min_seconds * self.sample_rate
        return sum(overlap > least for overlap in self._overlaps(*self._bounds(start, end)))

    def span(self, start: float, end: float) -> Tuple[float, float]:
        """The recording's (start, end) of a segment from `start` to `end` seconds into the window.

        A segment is placed inside one piece: the one holding the largest part of it (piece_of), its times clamped
        to that piece. Pieces are separated in the recording by audio VAD left out (at least
        min_silence_duration_ms of it, less the padding), where no phrase goes on, and Whisper's timestamps next
        to a splice are off by tenths of a second: a segment reaching across one would otherwise span the gap.
        (A segment whose timed words fall in several pieces is split there first: segments.py.)
        """
        k = self.piece_of(start, end)
        a, b = self._bounds(start, end)
        a = min(max(a, self.window_starts[k]), self.window_ends[k])
        b = min(max(b, self.window_starts[k]), self.window_ends[k])
        offset = self.regions[k][0] - self.window_starts[k]
        return (offset + a) / self.sample_rate, (offset + b) / self.sample_rate

    def __repr__(self) -> str:
        spans = ", ".join(f"{s / self.sample_rate:.3f}-{e / self.sample_rate:.3f}" for s, e in self.regions)
        return f"TimeMap([{spans}] s)"


@dataclasses.dataclass
class SpeechWindow:
    """One window to decode: the concatenated samples of its regions and their time map."""

    samples: np.ndarray
    time_map: TimeMap


def split_long_regions(regions: Sequence[Region], max_samples: int) -> List[Region]:
    """Regions longer than `max_samples` cut into consecutive pieces of at most that length, in order."""
    if max_samples < 1:
        raise ValueError(f"max_samples must be >= 1, got {max_samples}")
    out: List[Region] = []
    for start, end in regions:
        while end - start > max_samples:
            out.append((start, start + max_samples))
            start += max_samples
        if end > start:
            out.append((start, end))
    return out


class RegionGroups:
    """Regions grouped, in order, into windows of at most `window_samples` samples in total, one region at a time:
    a region joins the open group while its total stays within the limit, else the group is complete (`add` returns
    it) and the region opens the next; `close` hands over the open group."""

    def __init__(self, window_samples: int) -> None:
        self.window_samples = window_samples
        self.open: List[Region] = []
        self.filled = 0

    def add(self, region: Region) -> Optional[List[Region]]:
        length = region[1] - region[0]
        done = self.close() if self.open and self.filled + length > self.window_samples else None
        self.open.append(region)
        self.filled += length
        return done

    def close(self) -> Optional[List[Region]]:
        done, self.open, self.filled = self.open or None, [], 0
        return done


def pack_regions(regions: Sequence[Region], window_samples: int) -> List[List[Region]]:
    """Group regions, in order, into windows of at most `window_samples` samples in total.

    Greedy, as faster-whisper's `collect_chunks` (RegionGroups): a region joins the current window if the window's
    total stays within the limit, else it opens the next window. Regions are never reordered and never overlap two
    windows; one longer than a window is first cut into window-sized pieces.
    """
    groups = RegionGroups(window_samples)
    windows = []
    for region in split_long_regions(regions, window_samples):
        done = groups.add(region)
        if done:
            windows.append(done)
    last = groups.close()
    return windows + [last] if last else windows


def speech_windows(audio: np.ndarray, regions: Sequence[Region], window_samples: int) -> List[SpeechWindow]:
    """The packed windows of `audio` for `regions`: samples concatenated in order, with their time maps."""
    return [SpeechWindow(np.concatenate([audio[start:end] for start, end in group]), TimeMap(group))
            for group in pack_regions(regions, window_samples)]


def window_vad_options(vad_filter: Optional[bool], vad_parameters: Any,
                       window_samples: int) -> Optional[VadOptions]:
    """The VadOptions transcription uses (None with vad_filter False; None, the automatic choice, gets them too):
    max_speech_duration_s capped at the window."""
    if vad_filter is not None and not isinstance(vad_filter, bool):
        raise TypeError(f"vad_filter must be None, True or False, got {vad_filter!r}")
    options = VadOptions.from_parameters(vad_parameters)  # validated even when unused: a typo is an error
    window_s = window_samples / SAMPLE_RATE
    if vad_filter is False:
        return None
    model_path()  # VadUnavailable now, before any input is loaded, if the weights are not installed
    return dataclasses.replace(options, max_speech_duration_s=min(options.max_speech_duration_s, window_s))


def intersect_regions(regions: Sequence[Region], spans: Sequence[Region]) -> List[Region]:
    """The parts of `regions` inside `spans` (both ordered and non-overlapping), in order, empty parts left out."""
    out: List[Region] = []
    for start, end in regions:
        for span_start, span_end in spans:
            a, b = max(start, span_start), min(end, span_end)
            if a < b:
                out.append((a, b))
    return out


def detect_speech_windows(audio: np.ndarray, options: VadOptions, window_samples: int,
                          within: Optional[Sequence[Region]] = None) -> List[SpeechWindow]:
    """Speech regions of `audio` (Silero VAD), only their parts inside the spans `within` when given (clip_timestamps),
    packed into windows; [] when there is no speech."""
    regions = speech_regions(audio, options)
    if within is not None:
        regions = intersect_regions(regions, within)
    return speech_windows(audio, regions, window_samples)
