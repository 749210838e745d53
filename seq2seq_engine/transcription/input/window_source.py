"""Reading one input as the windows the pipeline decodes: 30 s cuts streamed from the decoder (only the
`clip_timestamps` spans when given), or with VAD the speech regions packed into windows."""
from __future__ import annotations

from typing import Any, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from seq2seq_engine.audio import HOP_LENGTH, SAMPLE_RATE, iter_windows, split_into_windows
from seq2seq_engine.audio.silero import BLOCK_FRAMES, FRAME_SAMPLES
from seq2seq_engine.audio.vad import VadOptions
from seq2seq_engine.transcription.input.vad_stream import VadWindowStream
from seq2seq_engine.transcription.input.vad_windows import TimeMap

Span = Tuple[int, Optional[int]]  # [start, end) samples; end None: the end of the audio
Cut = Tuple[int, np.ndarray, Optional[TimeMap]]  # (start sample in the input, samples, time map of packed speech)


def clip_spans(clip_timestamps: Sequence[float], num_samples: Optional[int]) -> List[Span]:
    """[start, end) samples of each clip: `clip_timestamps` is start,end,start,end,... seconds (openai-whisper:
    rounded to 10 ms feature frames; a missing last end is the end of the audio, `num_samples`, or None when it is
    not known yet; none at all is the whole input)."""
    points: List[Optional[int]] = [int(round(t * SAMPLE_RATE / HOP_LENGTH)) * HOP_LENGTH for t in clip_timestamps]
    points = points or [0]
    if len(points) % 2:
        points.append(num_samples)
    return list(zip(points[::2], points[1::2]))


def clip_windows(audio: np.ndarray, clip_timestamps: Sequence[float],
                 window: int) -> List[Tuple[int, np.ndarray]]:
    """(start sample, samples) windows of at most `window` samples covering only the clips (clip_spans); each clip
    is split from its own start."""
    windows = []
    for start, end in clip_spans(clip_timestamps, len(audio)):
        start, end = min(start, len(audio)), min(end, len(audio))
        windows += [(start + offset, chunk) for offset, chunk in
                    split_into_windows(audio[start:end], window_s=window / SAMPLE_RATE)]
    return windows


def clip_stream(blocks: Iterator[np.ndarray], spans: Sequence[Span], window: int) -> Iterator[Tuple[int, np.ndarray]]:
    """`clip_windows` of the audio that `blocks` make laid end to end, read as far as each window needs: only the
    window being cut and the block that reaches past it are held. The blocks after the last span are read too (so
    the caller learns the input's length) and dropped."""
    buffer, buffer_start = np.zeros(0, np.float32), 0  # buffer holds the input's samples from buffer_start on
    for start, end in spans:
        position = start
        while end is None or position < end:
            stop = position + window if end is None else min(position + window, end)
            while True:  # drop what lies before `position`, read on until the buffer reaches `stop` or the end
                drop = min(max(position - buffer_start, 0), len(buffer))
                buffer, buffer_start = buffer[drop:], buffer_start + drop
                block = next(blocks, None) if buffer_start + len(buffer) < stop else None
                if block is None:
                    break
                buffer = np.concatenate([buffer, block]) if len(buffer) else block
            piece = buffer[position - buffer_start:stop - buffer_start].copy()
            if not len(piece):
                break
            yield position, piece
            position += len(piece)
            if position < stop:  # the audio ended inside this window
                break
    for _ in blocks:
        pass


class WindowReader:
    """One input's windows, read as the pipeline asks for them (`next_window`; None once all are read).

    Without VAD the file is decoded as a stream of 30 s windows (audio/stream.py), cut to the clips when
    `clip_timestamps` are given, so memory holds the windows in flight, not the input. With `vad` the input is also
    decoded once, as a stream of Silero blocks feeding both the probabilities and the samples of its speech regions
    (inside the clips), packed into windows with their time maps as they fill (vad_stream.py). With `max_seconds`,
    audio longer than that raises AudioTooLong when the decoder passes it, or on opening a file whose header says
    so. `position` counts the input's samples decoded so far and `skipped` those of them no window covers (outside the
    clips, or not speech); both are final once `done`. Reading problems raise AudioError (or ValueError/TypeError).
    """

    def __init__(self, source: Any, window_samples: int, clip_timestamps: Sequence[float] = (),
                 vad: Optional[VadOptions] = None, max_seconds: Optional[float] = None) -> None:
        self.source, self.window_samples, self.max_seconds = source, window_samples, max_seconds
        self.clip_timestamps, self.vad = tuple(clip_timestamps), vad
        self.position = 0
        self.covered = 0  # samples in the windows handed out
        self.skipped = 0
        self.done = False
        self._stream: Optional[Iterator[np.ndarray]] = None
        self._cuts: Optional[Iterator[Cut]] = None

    def next_window(self) -> Optional[Cut]:
        if self._cuts is None and not self.done:
            self._cuts = self._vad_cuts() if self.vad is not None else self._streamed_cuts()
        cut = next(self._cuts, None) if self._cuts is not None else None
        if cut is None:
            self.done = True
            self.close()
            self.skipped = self.position - self.covered
            return None
        if self.vad is None:
            self.skipped = cut[0] - self.covered  # the windows are in order: what lies before this one is decided
        self.covered += len(cut[1])
        return cut

    def close(self) -> None:
        """Close the decoder and its file (also when the input failed or the caller stopped early)."""
        for iterator in (self._cuts, self._stream):
            if iterator is not None:
                iterator.close()
        self._cuts = self._stream = None

    def _counted(self, blocks: Iterator[np.ndarray]) -> Iterator[np.ndarray]:
        for block in blocks:
            self.position += len(block)
            yield block

    def _streamed_cuts(self) -> Iterator[Cut]:
        self._stream = iter_windows(self.source, self.window_samples, max_seconds=self.max_seconds)  # opened when read
        blocks = self._counted(self._stream)
        if not self.clip_timestamps:
            for samples in blocks:
                yield self.position - len(samples), samples, None
            return
        for start, samples in clip_stream(blocks, clip_spans(self.clip_timestamps, None), self.window_samples):
            yield start, samples, None

    def _vad_cuts(self) -> Iterator[Cut]:
        self._stream = iter_windows(self.source, BLOCK_FRAMES * FRAME_SAMPLES, max_seconds=self.max_seconds)
        spans = clip_spans(self.clip_timestamps, None) if self.clip_timestamps else None
        yield from VadWindowStream(self._counted(self._stream), self.vad, self.window_samples, spans)
