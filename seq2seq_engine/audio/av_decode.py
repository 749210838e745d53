"""Decoding of any audio FFmpeg reads (mp3, m4a/aac, ogg/opus, webm, mp4/mkv audio tracks, ...) via PyAV."""
from __future__ import annotations

import io
import logging
import os
from typing import Any, Generator, Iterator, Optional

import numpy as np

from .base import SAMPLE_RATE, AudioError, AudioTooLong

logger = logging.getLogger(__name__)

# A decoded stream shorter than its declared duration by more than this many seconds and this fraction is truncated.
TRUNCATION_TOLERANCE_S = 1.0
TRUNCATION_TOLERANCE_FRACTION = 0.05
# A live stream (a pipe) is read in small pieces and probed briefly, so its first audio is not held back for seconds.
LIVE_BUFFER_BYTES = 4096
LIVE_OPTIONS = {"probesize": "32768", "analyzeduration": "200000"}  # bytes; microseconds


def _ffmpeg_message(error: BaseException) -> str:
    """FFmpeg's own words for an error, without the errno and the file name PyAV adds."""
    message = getattr(error, "strerror", None) or str(error).strip() or type(error).__name__
    return str(message)


def _open(source: Any, name: str, **open_kwargs: Any) -> Any:
    import av

    if isinstance(source, (bytes, bytearray)):
        source = io.BytesIO(bytes(source))
    elif isinstance(source, os.PathLike):
        source = os.fspath(source)
    try:
        return av.open(source, mode="r", metadata_errors="ignore", **open_kwargs)
    except Exception as error:  # av.error.FFmpegError (InvalidDataError, EOFError, OSError, ...), ValueError
        raise AudioError(f"{name}: cannot decode audio file (corrupt or unsupported format): "
                         f"{_ffmpeg_message(error)}") from error


def _declared_seconds(container: Any, stream: Any) -> Optional[float]:
    """The audio stream's duration as the container declares it (None when it does not)."""
    if stream.duration is not None and stream.time_base is not None:
        return float(stream.duration * stream.time_base)
    if container.duration is not None and len(container.streams) == 1:  # audio-only file: the file's duration
        return container.duration / 1_000_000
    return None


def av_duration(source: Any) -> Optional[float]:
    """Seconds of audio the container declares for its first audio stream (None when it declares none or cannot be
    opened); reads only the header."""
    try:
        container = _open(source, "<probe>")
    except AudioError:
        return None
    with container:
        if not container.streams.audio:
            return None
        stream = container.streams.audio[0]
        seconds = _declared_seconds(container, stream)
        if seconds is None and container.duration is not None:
            seconds = container.duration / 1_000_000
        return seconds


def _frames(container: Any, stream: Any, name: str) -> Iterator[Any]:
    """Decoded frames of `stream`, packet by packet; invalid packets are skipped."""
    import av

    skipped = 0
    try:
        for packet in container.demux(stream):
            try:
                frames = packet.decode()
            except av.error.InvalidDataError:
                skipped += 1
                continue
            yield from frames
    except AudioError:
        raise
    except Exception as error:  # a demuxer/decoder failure other than one bad packet
        raise AudioError(f"{name}: cannot decode audio file (corrupt or truncated): "
                         f"{_ffmpeg_message(error)}") from error
    if skipped:
        logger.warning("%s: skipped %d undecodable packet(s)", name, skipped)


def _mono(frame: Any) -> np.ndarray:
    """The channel mean of an fltp frame, as `frame.to_ndarray().mean(axis=0, dtype=np.float32)` computes it (the
    planes added in order, then divided by their count), read from the planes without the per-frame stacking and
    reduction wrappers (a third of a 30-minute MP3's decode time)."""
    planes = [np.frombuffer(plane, dtype=np.float32, count=frame.samples) for plane in frame.planes]
    total = planes[0].copy()  # the frame's buffer is the resampler's, reused by its next call
    for plane in planes[1:]:
        total += plane
    if len(planes) > 1:
        np.true_divide(total, len(planes), out=total)
    return total


def iter_av_blocks(source: Any, name: str, target_sr: int = SAMPLE_RATE,
                   max_seconds: Optional[float] = None) -> Iterator[np.ndarray]:
    """Yield the first audio stream of `source` (a path, raw bytes or a seekable binary file object) as consecutive
    1-D float32 mono blocks at `target_sr`, one decoded frame at a time (never the whole file).

    Each frame is converted by FFmpeg's resampler (``AudioResampler``) to float32 at `target_sr` keeping its channels,
    which are then averaged (as the soundfile path does; FFmpeg's own mono downmix scales stereo by 1/sqrt(2)). A packet
    the decoder rejects as invalid data is skipped (as FFmpeg's command line and faster-whisper do). ``AudioError``
    (naming the file) for a file FFmpeg cannot open, one with no audio stream, one that decodes to no samples, and one
    whose audio ends well before the duration its container declares (a truncated download); ``AudioTooLong`` on
    opening when the container declares more than `max_seconds`.
    """
    with _open(source, name) as container:
        stream = _audio_stream(container, name)
        declared = _declared_seconds(container, stream)
        if max_seconds is not None and declared is not None and declared > max_seconds:
            raise AudioTooLong(name, max_seconds, declared)
        total = yield from _resampled(container, stream, name, target_sr)
        _check_length(total / target_sr, declared, name)


def iter_av_live(source: Any, name: str, target_sr: int = SAMPLE_RATE) -> Iterator[np.ndarray]:
    """Like ``iter_av_blocks`` for a live binary stream that may not seek (a pipe): read in small pieces and probed
    briefly, each block yielded as soon as its frame is decoded. ``AudioError`` as for ``iter_av_blocks``."""
    with _open(source, name, buffer_size=LIVE_BUFFER_BYTES, options=dict(LIVE_OPTIONS)) as container:
        total = yield from _resampled(container, _audio_stream(container, name), name, target_sr)
        _check_length(total / target_sr, None, name)


def _audio_stream(container: Any, name: str) -> Any:
    if not container.streams.audio:
        kinds = sorted({s.type for s in container.streams}) or ["no"]
        raise AudioError(f"{name}: no audio stream in the file (it has {', '.join(kinds)} streams)")
    return container.streams.audio[0]


def _resampled(container: Any, stream: Any, name: str, target_sr: int) -> Generator[np.ndarray, None, int]:
    """The stream's frames as mono float32 blocks at `target_sr`; returns how many samples it yielded."""
    from av.audio.resampler import AudioResampler

    resampler = AudioResampler(format="fltp", layout=None, rate=target_sr)  # layout None: keep the channels
    total = 0
    try:
        for frame in _frames(container, stream, name):
            for out in resampler.resample(frame):
                block = _mono(out)
                total += len(block)
                yield block
        for out in resampler.resample(None):  # flush the resampler's delay line
            block = _mono(out)
            total += len(block)
            yield block
    except ValueError as error:  # the resampler refusing a frame (format changes mid-stream it cannot follow)
        raise AudioError(f"{name}: cannot decode audio file: {error}") from error
    return total


def _check_length(decoded: float, declared: Optional[float], name: str) -> None:
    if decoded == 0:
        raise AudioError(f"{name}: audio file contains no samples")
    if declared is None:
        return
    missing = declared - decoded
    if missing > TRUNCATION_TOLERANCE_S and missing > TRUNCATION_TOLERANCE_FRACTION * declared:
        raise AudioError(f"{name}: audio file is truncated: decoded {decoded:.2f} s of the {declared:.2f} s "
                         f"its container declares")


def decode_av(source: Any, name: str, target_sr: int = SAMPLE_RATE) -> np.ndarray:
    """The whole first audio stream of `source` as one 1-D float32 mono array at `target_sr`."""
    return np.concatenate(list(iter_av_blocks(source, name, target_sr)))
