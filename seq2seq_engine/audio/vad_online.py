"""Speech regions as the probabilities arrive: Silero's detection rules and the padding, one frame at a time."""
from __future__ import annotations

from typing import Any, List, Optional, Tuple

from .base import SAMPLE_RATE
from .silero import FRAME_SAMPLES

Region = Tuple[int, int]  # [start, end) in samples of the 16 kHz recording

# A silence this long inside a region is a place where a region reaching max_speech_duration_s may be cut.
MIN_SILENCE_AT_MAX_SPEECH_MS = 98


class RegionDetector:
    """Unpadded regions with the rules of Silero's `get_speech_timestamps` as faster-whisper runs it, one frame's
    probability at a time (`push` returns the regions that frame closes, `finish` the one the end closes).

    Speech starts at a frame >= threshold. Inside speech, a run of frames < neg_threshold is a silence; frames
    between the thresholds continue whatever run they are in. A silence of min_silence_duration_ms ends the region
    where the silence began (regions not longer than min_speech_duration_ms are dropped). A region that grows past
    the maximum is cut at the start of its last silence of more than 98 ms, and speech that resumed after that
    silence opens the next region; with no such silence it is cut at the current frame.
    """

    def __init__(self, options: Any) -> None:   # a VadOptions
        rate = SAMPLE_RATE / 1000
        self.threshold = options.threshold
        self.negative = options.neg_threshold if options.neg_threshold is not None else max(self.threshold - 0.15,
                                                                                            0.01)
        self.min_speech = options.min_speech_duration_ms * rate
        self.min_silence = options.min_silence_duration_ms * rate
        self.cut_silence = MIN_SILENCE_AT_MAX_SPEECH_MS * rate
        self.max_speech = (options.max_speech_duration_s * SAMPLE_RATE - FRAME_SAMPLES
                           - 2 * options.speech_pad_ms * rate)
        self.frames = 0  # frames pushed so far
        self.open_start: Optional[int] = None  # the open region's first sample, None outside speech
        self.silence_from = 0  # where the current silence began (0: no silence under way)
        self.cut_at = 0  # the start of the open region's last silence longer than 98 ms (0: none)
        self.resume_at = 0  # where speech came back after that silence

    def push(self, probability: float) -> List[Region]:
        here = self.frames * FRAME_SAMPLES
        self.frames += 1
        closed: List[Region] = []
        if probability >= self.threshold and self.silence_from:
            self.silence_from = 0
            if self.resume_at < self.cut_at:
                self.resume_at = here
        if probability >= self.threshold and self.open_start is None:
            self.open_start = here
            return closed
        if self.open_start is not None and here - self.open_start > self.max_speech:
            if self.cut_at:
                closed.append((self.open_start, self.cut_at))
                self.open_start = self.resume_at if self.resume_at >= self.cut_at else None
            else:
                closed.append((self.open_start, here))
                self.open_start = None
            self.cut_at = self.resume_at = self.silence_from = 0
            if self.open_start is None:
                return closed
        if self.open_start is not None and probability < self.negative:
            self.silence_from = self.silence_from or here
            if here - self.silence_from > self.cut_silence:
                self.cut_at = self.silence_from
            if here - self.silence_from < self.min_silence:
                return closed
            if self.silence_from - self.open_start > self.min_speech:
                closed.append((self.open_start, self.silence_from))
            self.open_start = None
            self.cut_at = self.resume_at = self.silence_from = 0
        return closed

    def finish(self, n_samples: int) -> List[Region]:
        """The region still open at the end of `n_samples` samples, if long enough."""
        start, self.open_start = self.open_start, None
        return [(start, n_samples)] if start is not None and n_samples - start > self.min_speech else []


class RegionPadder:
    """Each region widened by `pad` samples on both sides, two regions closer than 2 * pad sharing the gap, one
    region at a time: a region is held until its end is known, when the next region arrives or once the audio has
    run 2 * pad past it with no speech begun before then (`advance`)."""

    def __init__(self, pad: float) -> None:
        self.pad = pad
        self.held: Optional[Tuple[int, int]] = None  # (padded start, unpadded end) of the region held

    def push(self, region: Region) -> List[Region]:
        start, end = region
        done: List[Region] = []
        if self.held is None:
            start = int(max(0, start - self.pad))
        else:
            held_start, held_end = self.held
            gap = start - held_end
            if gap < 2 * self.pad:
                done.append((held_start, held_end + gap // 2))
                start = int(max(0, start - gap // 2))
            else:
                done.append((held_start, int(held_end + self.pad)))
                start = int(max(0, start - self.pad))
        self.held = (start, end)
        return done

    def advance(self, position: int, open_start: Optional[int]) -> List[Region]:
        """The held region, final once no region can start within 2 * pad of its end: the audio has been read to
        `position` and the region under way (if any) starts at `open_start`."""
        if self.held is None:
            return []
        held_start, held_end = self.held
        reach = held_end + 2 * self.pad
        if position < reach or (open_start is not None and open_start < reach):
            return []
        self.held = None
        return [(held_start, int(held_end + self.pad))]

    def finish(self, n_samples: int) -> List[Region]:
        held, self.held = self.held, None
        return [] if held is None else [(held[0], int(min(n_samples, held[1] + self.pad)))]

    @property
    def held_start(self) -> Optional[int]:
        return None if self.held is None else self.held[0]
