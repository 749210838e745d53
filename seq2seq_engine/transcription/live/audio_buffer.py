"""The samples a live transcription holds (a growable array addressed by stream index), the refusal when it holds
too much, and where a turn longer than a window is cut."""
from __future__ import annotations

import numpy as np

from seq2seq_engine.audio import SAMPLE_RATE

# A window is cut at the quietest 100 ms of its last 5 s when that block is well below the typical level there (a
# pause between words); else at its end.
CUT_SEARCH_SAMPLES, CUT_BLOCK_SAMPLES, CUT_QUIET_RATIO = 5 * SAMPLE_RATE, SAMPLE_RATE // 10, 0.25


class AudioBacklog(ValueError):
    """Audio appended while the transcription holds more than max_buffered_s not yet decoding: the owner must wait
    for outputs (`LiveSession.backlogged`) before appending more."""

    def __init__(self, held_s: float, limit_s: float) -> None:
        super().__init__(f"the transcription holds {held_s:.1f} s of audio not yet transcribed, more than "
                         f"max_buffered_s={limit_s:g}: wait for its decodes to finish before appending more")
        self.held_s, self.limit_s = held_s, limit_s


class AudioBuffer:
    """Samples `start`..`end` - 1 of a stream (indices count from its first sample): appended at the end, dropped
    from the front; amortised O(1) appends (the array doubles when full)."""

    def __init__(self) -> None:
        self._data = np.zeros(16000, dtype=np.float32)
        self.start = 0
        self._length = 0

    @property
    def end(self) -> int:
        return self.start + self._length

    def __len__(self) -> int:
        return self._length

    def append(self, samples: np.ndarray) -> None:
        need = self._length + len(samples)
        if need > len(self._data):
            grown = np.zeros(max(need, 2 * len(self._data)), dtype=np.float32)
            grown[:self._length] = self._data[:self._length]
            self._data = grown
        self._data[self._length:need] = samples
        self._length = need

    def slice(self, first: int, last: int) -> np.ndarray:
        """A copy of samples first..last - 1 (clamped to what is held)."""
        first, last = max(first, self.start), min(last, self.end)
        return self._data[first - self.start:max(last, first) - self.start].copy()

    def quiet_cut(self, first: int, last: int) -> int:
        """Where to end a part of a turn that holds samples first..last - 1 (one Whisper window), as a stream index:
        `quiet_cut` over the part's last 5 s only, read in place."""
        first, last = max(first, last - CUT_SEARCH_SAMPLES, self.start), min(last, self.end)
        return first + quiet_cut(self._data[first - self.start:max(last, first) - self.start])

    def drop_before(self, index: int) -> None:
        """Forget the samples before `index` (all of them when it lies beyond the end: the next sample appended
        is then sample `index`)."""
        if index <= self.start:
            return
        if index >= self.end:
            self.start, self._length = index, 0
            return
        cut = index - self.start
        self._data[:self._length - cut] = self._data[cut:self._length]
        self.start, self._length = index, self._length - cut


def check_samples(samples: np.ndarray) -> np.ndarray:
    """`samples` as float32 mono; TypeError/ValueError naming what is wrong."""
    if not isinstance(samples, np.ndarray):
        raise TypeError(f"samples must be a numpy array, got {type(samples).__name__}")
    if samples.ndim != 1:
        raise ValueError(f"samples must be 1-D mono audio, got shape {tuple(samples.shape)}")
    if samples.dtype.kind != "f":
        raise TypeError(f"samples must be float audio in [-1, 1], got dtype {samples.dtype}")
    return samples.astype(np.float32, copy=False)


def quiet_cut(window: np.ndarray) -> int:
    """Where to end a part of a turn that fills `window` (one Whisper window of samples): the middle of the quietest
    100 ms block of its last 5 s if it is a pause (RMS under a quarter of the blocks' median), else its end."""
    count = min(len(window), CUT_SEARCH_SAMPLES) // CUT_BLOCK_SAMPLES
    if count < 2:
        return len(window)
    first = len(window) - count * CUT_BLOCK_SAMPLES
    blocks = window[first:].reshape(count, CUT_BLOCK_SAMPLES).astype(np.float64)
    rms = np.sqrt(np.mean(blocks * blocks, axis=1))
    quietest = int(np.argmin(rms))
    if not rms[quietest] < CUT_QUIET_RATIO * float(np.median(rms)):
        return len(window)
    return first + quietest * CUT_BLOCK_SAMPLES + CUT_BLOCK_SAMPLES // 2
