"""One decode of an input feeding both the VAD and the windows: speech regions found as the audio streams in,
packed into 30 s windows as each fills, holding only the audio that a region still to come can reach."""
from __future__ import annotations

from typing import Iterable, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from seq2seq_engine.audio import SAMPLE_RATE
from seq2seq_engine.audio.silero import FRAME_SAMPLES, load_silero_vad
from seq2seq_engine.audio.vad import VadOptions
from seq2seq_engine.audio.vad_online import Region, RegionDetector, RegionPadder
from seq2seq_engine.transcription.input.vad_windows import RegionGroups, TimeMap, intersect_regions, split_long_regions

Cut = Tuple[int, np.ndarray, TimeMap]  # (start sample in the input, samples, time map of packed speech)
Span = Tuple[int, Optional[int]]  # [start, end) samples; end None: the end of the audio
_NO_END = 1 << 62


class SampleBuffer:
    """The decoded audio from sample `start` on, as the blocks it was read in: regions are copied out of it, and
    blocks that no region still to come can reach are dropped. `peak`: the most samples held at once."""

    def __init__(self) -> None:
        self.blocks: List[np.ndarray] = []
        self.start = 0  # the input's sample at blocks[0][0]
        self.end = 0  # samples read so far
        self.peak = 0

    def append(self, block: np.ndarray) -> None:
        self.blocks.append(block)
        self.end += len(block)
        self.peak = max(self.peak, self.end - self.start)

    def take(self, start: int, end: int) -> np.ndarray:
        """A copy of samples start..end (which must still be held)."""
        if start < self.start or end > self.end:
            raise RuntimeError(f"samples {start}..{end} are not held (held: {self.start}..{self.end})")
        pieces, position = [], self.start
        for block in self.blocks:
            first, last = max(start, position), min(end, position + len(block))
            if first < last:
                pieces.append(block[first - position:last - position])
            position += len(block)
        return np.concatenate(pieces) if pieces else np.zeros(0, np.float32)

    def drop_before(self, sample: int) -> None:
        """Forget the samples before `sample`: whole blocks, and the head of the first block kept (its tail copied,
        so the block's memory goes)."""
        while self.blocks and self.start + len(self.blocks[0]) <= sample:
            self.start += len(self.blocks.pop(0))
        if self.blocks and sample > self.start:
            self.blocks[0] = self.blocks[0][sample - self.start:].copy()
            self.start = sample


class WindowPacker:
    """RegionGroups with each region's samples: `add` returns the window a region does not fit in, as a cut."""

    def __init__(self, window_samples: int) -> None:
        self.groups = RegionGroups(window_samples)
        self.pieces: List[np.ndarray] = []

    def add(self, region: Region, samples: np.ndarray) -> Optional[Cut]:
        cut = self._cut(self.groups.add(region))
        self.pieces.append(samples)
        return cut

    def flush(self) -> Optional[Cut]:
        """The open window, if any, as a cut."""
        return self._cut(self.groups.close())

    def _cut(self, group: Optional[List[Region]]) -> Optional[Cut]:
        if group is None:
            return None
        cut = (group[0][0], np.concatenate(self.pieces[:len(group)]), TimeMap(group))
        del self.pieces[:len(group)]
        return cut


class VadWindowStream:
    """The windows of `blocks` (an input's audio as consecutive 16 kHz blocks of at most silero.BLOCK_FRAMES frames)
    with VAD on: exactly vad_windows.speech_windows of the whole audio's speech regions (only their parts inside
    `spans`, the clips, when given), from one pass over the blocks. A window is yielded once the next region does
    not fit in it; the blocks held are those a region still to come can reach (the region under way, the one
    waiting for its padded end, and `speech_pad_ms` before the frame being read)."""

    def __init__(self, blocks: Iterable[np.ndarray], options: VadOptions, window_samples: int,
                 spans: Optional[Sequence[Span]] = None) -> None:
        self.blocks, self.window_samples = blocks, window_samples
        self.spans = None if spans is None else [(start, _NO_END if end is None else end) for start, end in spans]
        self.buffer = SampleBuffer()
        self.detector = RegionDetector(options)
        self.padder = RegionPadder(options.speech_pad_ms * SAMPLE_RATE / 1000)
        self.packer = WindowPacker(window_samples)

    def __iter__(self) -> Iterator[Cut]:
        for probabilities in load_silero_vad().iter_probabilities(self._buffered()):
            for probability in probabilities.tolist():
                regions = [padded for region in self.detector.push(probability)
                           for padded in self.padder.push(region)]
                regions += self.padder.advance(self.detector.frames * FRAME_SAMPLES, self.detector.open_start)
                yield from self._place(regions)
            self.buffer.drop_before(self._needed_from())
        length = self.buffer.end
        regions = [padded for region in self.detector.finish(length) for padded in self.padder.push(region)]
        yield from self._place(regions + self.padder.finish(length))
        last = self.packer.flush()
        if last is not None:
            yield last

    def _buffered(self) -> Iterator[np.ndarray]:
        for block in self.blocks:
            self.buffer.append(block)
            yield block

    def _needed_from(self) -> int:
        """The first sample a region not yet placed can reach."""
        pad = self.padder.pad
        reach = [self.detector.frames * FRAME_SAMPLES - pad]
        if self.detector.open_start is not None:
            reach.append(self.detector.open_start - pad)
        if self.padder.held_start is not None:
            reach.append(self.padder.held_start)
        return max(0, int(min(reach)))

    def _place(self, regions: Sequence[Region]) -> Iterator[Cut]:
        for region in regions:
            pieces = [region] if self.spans is None else intersect_regions([region], self.spans)
            for start, end in split_long_regions(pieces, self.window_samples):
                done = self.packer.add((start, end), self.buffer.take(start, end))
                if done is not None:
                    yield done
