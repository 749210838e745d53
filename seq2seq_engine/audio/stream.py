"""Audio read lazily as consecutive fixed-length windows of 16 kHz mono float32 (long files never whole in memory)."""
from __future__ import annotations

import math
import os
from typing import Any, Callable, Iterator, List, Optional

import numpy as np

from .base import SAMPLE_RATE, AudioError, AudioTooLong
from .loading import _describe, _to_float32, _to_mono, load_audio, open_soundfile

# Frames read from libsndfile at a time (about 1.4-4 s at common rates).
BLOCK_FRAMES = 1 << 16
# Resampled samples held back until the input ends, so its length can be fitted to ceil(n * target_sr / sr).
_HOLDBACK = 4096


def is_file_source(source: Any) -> bool:
    """A path, raw file bytes or a binary file object (decoded from a container), not samples in memory."""
    return isinstance(source, (str, os.PathLike, bytes, bytearray)) or hasattr(source, "read")


def iter_windows(source: Any, window_samples: int, target_sr: int = SAMPLE_RATE,
                 max_seconds: Optional[float] = None) -> Iterator[np.ndarray]:
    """Yield the audio of `source` as consecutive 1-D float32 windows of `window_samples` samples at `target_sr`
    (the last one shorter), decoding only as far as the windows taken so far need.

    Their concatenation equals ``load_audio(source, target_sr)`` exactly: files libsndfile reads are read in blocks,
    down-mixed and resampled with a soxr stream (the same numerics as the one-shot resample); other files are decoded
    frame by frame by FFmpeg (``av_decode.iter_av_blocks``); arrays and (array, rate) tuples are in memory already and
    come back as views. Problems raise ``AudioError`` when reached (a file is opened on the first ``next``).
    With `max_seconds`, ``AudioTooLong`` as soon as the decoded audio passes it, or on opening a file whose header
    declares more: a file is never decoded past the limit.
    """
    if window_samples <= 0:
        raise ValueError(f"window_samples must be positive, got {window_samples}")
    if not is_file_source(source):
        audio = load_audio(source, target_sr)
        if max_seconds is not None and len(audio) > max_seconds * target_sr:
            raise AudioTooLong(_describe(source), max_seconds)
        for start in range(0, len(audio), window_samples):
            yield audio[start:start + window_samples]
        return
    name = _describe(source)
    blocks = _file_blocks(source, name, target_sr, max_seconds)
    windows = _rebuffer(blocks if max_seconds is None else _bounded(blocks, max_seconds, target_sr, name),
                        window_samples)
    first = next(windows, None)
    if first is None:
        raise AudioError(f"{name}: audio file contains no samples")
    yield first
    del first  # hold no window past its turn (a loop variable would keep the last one while the next is read)
    yield from windows


def _bounded(blocks: Iterator[np.ndarray], max_seconds: float, sample_rate: int, name: str) -> Iterator[np.ndarray]:
    total = 0
    for block in blocks:
        total += len(block)
        if total > max_seconds * sample_rate:
            blocks.close()  # type: ignore[attr-defined]  # the decoder and its file, now
            raise AudioTooLong(name, max_seconds)
        yield block
        del block


def _file_blocks(source: Any, name: str, target_sr: int, max_seconds: Optional[float]) -> Iterator[np.ndarray]:
    handle = open_soundfile(source, name)
    if handle is None:
        from .av_decode import iter_av_blocks

        yield from iter_av_blocks(source, name, target_sr, max_seconds)
        return
    with handle:
        source_sr = int(handle.samplerate)
        declared = handle.frames / source_sr if handle.frames > 0 else None
        if max_seconds is not None and declared is not None and declared > max_seconds:
            raise AudioTooLong(name, max_seconds, declared)
        blocks = _soundfile_blocks(handle, name)
        if source_sr == target_sr:
            yield from blocks
            return
        read = [0]  # input frames read so far, for the final length
        yield from _fit_length(_resample_stream(blocks, source_sr, target_sr, read),
                               lambda: math.ceil(read[0] * target_sr / source_sr))


def _soundfile_blocks(handle: Any, name: str) -> Iterator[np.ndarray]:
    while True:
        try:
            data = handle.read(BLOCK_FRAMES, dtype="float32", always_2d=True)
        except Exception as error:  # a read error after a good header
            message = str(error).strip() or type(error).__name__
            raise AudioError(f"{name}: cannot decode audio file (corrupt or unsupported format): {message}") from error
        if data.shape[0] == 0:
            return
        if data.shape[1] == 0:
            raise AudioError(f"{name}: audio file contains no samples")
        mono = _to_mono(_to_float32(data, name), name, channels_first=False)
        del data
        yield mono
        del mono


def _resample_stream(blocks: Iterator[np.ndarray], source_sr: int, target_sr: int,
                     read: List[int]) -> Iterator[np.ndarray]:
    """soxr "HQ" as a stream (equal to ``loading.resample`` on the whole signal); counts input frames in read[0]."""
    import soxr

    stream = soxr.ResampleStream(source_sr, target_sr, 1, dtype="float32", quality="HQ")
    for block in blocks:
        read[0] += len(block)
        resampled = stream.resample_chunk(block, last=False)
        del block
        yield resampled
        del resampled
    yield stream.resample_chunk(np.zeros(0, np.float32), last=True)


def _fit_length(chunks: Iterator[np.ndarray], total: Callable[[], int]) -> Iterator[np.ndarray]:
    """Pass `chunks` through, holding back the last samples, and pad or trim the end to ``total()`` samples."""
    tail = np.zeros(0, np.float32)
    emitted = 0
    for chunk in chunks:
        tail = np.concatenate([tail, chunk]) if len(tail) else chunk
        del chunk
        if len(tail) > _HOLDBACK:
            emitted += len(tail) - _HOLDBACK
            out, tail = tail[:-_HOLDBACK], tail[-_HOLDBACK:].copy()
            yield out
            del out
    wanted = total() - emitted
    if wanted < 0:  # never seen: soxr's stream overshoots by far less than the holdback
        raise AudioError(f"resampling produced {-wanted} samples too many before the end of the input")
    yield np.pad(tail, (0, wanted - len(tail))) if len(tail) < wanted else tail[:wanted]


def _rebuffer(blocks: Iterator[np.ndarray], window_samples: int) -> Iterator[np.ndarray]:
    """Copy a stream of blocks of any length into windows of `window_samples` (the last one shorter, never empty);
    a window's buffer is allocated when its first block arrives, so between windows only the yielded one exists."""
    window: Optional[np.ndarray] = None
    count = 0
    for block in blocks:
        while len(block):
            if window is None:
                window = np.empty(window_samples, np.float32)
            take = min(window_samples - count, len(block))
            window[count:count + take] = block[:take]
            count += take
            block = block[take:]
            if count == window_samples:
                full, window, count = window, None, 0
                yield full
                del full
    if window is not None and count:
        yield window[:count].copy()  # not a view: a short input should not hold a whole window's buffer


def samples_hint(source: Any, target_sr: int = SAMPLE_RATE) -> int:
    """Samples at `target_sr` a file holds, from its header only (libsndfile, else the container's declared duration
    via PyAV); 0 when unknown. A hint for progress bars: decoding gives the real length."""
    if not isinstance(source, (str, os.PathLike)):
        return 0
    try:
        handle = open_soundfile(source, _describe(source))
    except AudioError:
        return 0
    if handle is not None:
        with handle:
            return math.ceil(handle.frames * target_sr / handle.samplerate)
    from .av_decode import av_duration

    seconds = av_duration(source)
    return int(round(seconds * target_sr)) if seconds else 0


def declared_seconds(source: Any) -> Optional[float]:
    """Seconds of audio a file (a path or raw bytes) declares in its header, read without decoding; None when it
    declares none or cannot be opened."""
    try:
        handle = open_soundfile(source, _describe(source))
    except AudioError:
        return None
    if handle is not None:
        with handle:
            return handle.frames / handle.samplerate if handle.frames > 0 else None
    from .av_decode import av_duration

    return av_duration(source)
