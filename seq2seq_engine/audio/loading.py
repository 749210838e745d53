"""Decoding, validation and resampling of audio to 16 kHz mono float32.

Choices (documented because they affect numerics):

* Files are decoded with ``soundfile`` (libsndfile: WAV, FLAC, AIFF, OGG Vorbis/Opus, ...),
  always as float32, so integer PCM comes back scaled to [-1, 1).  MP3 and what libsndfile cannot read (m4a/aac,
  webm, mp4/mkv audio tracks, ...) are decoded by FFmpeg through PyAV (``av_decode.py``): libsndfile's MP3 samples
  depend on the size of its reads (block reads of 1000 frames came back corrupt), so it cannot stream them.
* Multi-channel audio is down-mixed by averaging the channels.
* Float arrays above full scale are scaled down to a peak of 1.0 (with a warning); files decode as they are (a
  stream cannot know the whole file's peak, and codecs overshoot full scale slightly). NaN or infinite samples are
  refused.
* Resampling uses ``soxr`` with quality ``"HQ"`` (``soxr_hq``) and the output is padded or
  trimmed to ``ceil(n * target_sr / source_sr)`` samples.  This is exactly what
  ``transformers.audio_utils.load_audio(..., backend="soundfile")`` and ``librosa.load`` do.
  (``WhisperFeatureExtractor`` itself never resamples: it rejects a wrong ``sampling_rate``.)
* Float input is passed through unscaled (as HF does); integer arrays are scaled by their
  full-scale value (int8/16/32: ``2**(bits-1)``, uint8: centred on 128).
"""

from __future__ import annotations

import io
import logging
import math
import os
from typing import Any

import numpy as np

from .base import SAMPLE_RATE, AudioError

logger = logging.getLogger(__name__)

# libsndfile formats decoded by FFmpeg instead (see the module docstring), and the file extensions that name them
# (libsndfile is not asked about those at all: its MPEG decoder prints to stderr on a bad file).
_FFMPEG_FORMATS = frozenset({"MP3"})
FFMPEG_EXTENSIONS = frozenset({".mp3", ".mp2", ".mpga"})

# Full-scale divisors for integer PCM arrays.
_INT_SCALE = {np.dtype(np.int8): 2.0**7, np.dtype(np.int16): 2.0**15, np.dtype(np.int32): 2.0**31}


def _describe(source: Any) -> str:
    if isinstance(source, (str, os.PathLike)):
        return os.fspath(source)
    if isinstance(source, (bytes, bytearray)):
        return f"<{len(source)} bytes>"
    if isinstance(source, np.ndarray):
        return f"<array shape={source.shape} dtype={source.dtype}>"
    return f"<{type(source).__name__}>"


def _to_float32(arr: np.ndarray, name: str) -> np.ndarray:
    """Validate dtype/values and convert to float32 (integers scaled to [-1, 1])."""
    dt = arr.dtype
    if dt in _INT_SCALE:
        return (arr.astype(np.float32) / np.float32(_INT_SCALE[dt])).astype(np.float32, copy=False)
    if dt == np.uint8:
        return (arr.astype(np.float32) - 128.0) / np.float32(128.0)
    if dt.kind == "f":
        out = arr.astype(np.float32, copy=False)
        finite = np.isfinite(out)
        if not finite.all():
            bad = int(out.size - np.count_nonzero(finite))
            what = "NaN" if np.isnan(out).any() else "infinite"
            raise AudioError(f"{name}: {bad} of {out.size} samples are {what} (non-finite values)")
        return out
    if dt.kind in "iu":
        raise AudioError(
            f"{name}: unsupported integer dtype {dt} (full scale is ambiguous); "
            "pass int16/int32 PCM or float samples in [-1, 1]"
        )
    raise AudioError(
        f"{name}: unsupported dtype {dt} (kind {dt.kind!r}); audio must be real float or integer PCM samples"
    )


def _within_full_scale(samples: np.ndarray, name: str) -> np.ndarray:
    """An in-memory float array scaled down to a peak of 1.0 where it passes full scale (integer PCM passed as
    floats, a gain error): Whisper's log-mel is not scale-invariant, and audio far above full scale decodes into
    garbage, slowly (decisions §70). Samples within [-1, 1] are returned as they are."""
    peak = float(np.max(np.abs(samples))) if samples.size else 0.0
    if peak <= 1.0:
        return samples
    logger.warning("%s: samples reach %.3g, above full scale (1.0): scaled down by that peak", name, peak)
    return (samples / np.float32(peak)).astype(np.float32, copy=False)


def _to_mono(arr: np.ndarray, name: str, channels_first: bool | None) -> np.ndarray:
    if arr.ndim == 1:
        return arr
    if arr.ndim != 2:
        raise AudioError(f"{name}: expected a 1-D (samples) or 2-D (samples x channels) array, got {arr.ndim}-D")
    if channels_first is None:
        # Arrays: soundfile's layout is (frames, channels); torch/HF often use (channels, frames).
        # The channel axis is taken to be the shorter one.
        channels_first = arr.shape[0] < arr.shape[1]
    if channels_first:
        arr = arr.T
    if arr.shape[1] == 1:
        return arr[:, 0]
    return arr.mean(axis=1, dtype=np.float32)


def resample(audio: np.ndarray, orig_sr: int, target_sr: int = SAMPLE_RATE) -> np.ndarray:
    """Resample 1-D float32 audio with soxr HQ, length ``ceil(n * target_sr / orig_sr)`` (librosa/HF rule)."""
    if orig_sr == target_sr:
        return audio
    import soxr

    n_out = math.ceil(audio.shape[0] * target_sr / orig_sr)
    out = soxr.resample(audio, orig_sr, target_sr, quality="HQ")
    if out.shape[0] < n_out:
        out = np.pad(out, (0, n_out - out.shape[0]))
    return out[:n_out]


def _check_path(source: Any, name: str) -> None:
    if isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
        if not os.path.exists(path):
            raise AudioError(f"{name}: file not found")
        if os.path.isdir(path):
            raise AudioError(f"{name}: is a directory, not an audio file")
        if os.path.getsize(path) == 0:
            raise AudioError(f"{name}: cannot decode audio file: it is empty (0 bytes)")
    elif isinstance(source, (bytes, bytearray)) and not source:
        raise AudioError(f"{name}: cannot decode audio file: it is empty (0 bytes)")


def open_soundfile(source: Any, name: str) -> Any:
    """An open ``soundfile.SoundFile`` for a path, bytes or file object, or None when libsndfile cannot read it or
    it is MP3 (then FFmpeg decodes it; a file object is rewound first). A missing path or a directory raises
    AudioError."""
    import soundfile as sf

    _check_path(source, name)
    if isinstance(source, (str, os.PathLike)) and os.path.splitext(os.fspath(source))[1].lower() in FFMPEG_EXTENSIONS:
        return None
    if isinstance(source, (bytes, bytearray)):
        source = io.BytesIO(bytes(source))
    try:
        handle = sf.SoundFile(source)
    except Exception:  # sf.LibsndfileError (format not recognised, ...), RuntimeError, TypeError for odd objects
        handle = None
    if handle is not None and handle.format in _FFMPEG_FORMATS:
        handle.close()
        handle = None
    if handle is None and hasattr(source, "seek"):
        source.seek(0)
    return handle


def _read_file(source: Any, name: str, target_sr: int) -> tuple[np.ndarray, int]:
    """(frames x channels float32, sample rate): libsndfile for the formats it reads (WAV, FLAC, OGG, ...), else
    FFmpeg via PyAV (MP3, m4a/aac, webm, mp4/mkv audio, ...), which returns mono at ``target_sr``."""
    handle = open_soundfile(source, name)
    if handle is None:
        from .av_decode import decode_av

        return decode_av(source, name, target_sr)[:, None], target_sr
    try:
        with handle as f:
            return f.read(dtype="float32", always_2d=True), int(f.samplerate)
    except Exception as e:  # a read error after a good header
        msg = str(e).strip() or type(e).__name__
        raise AudioError(f"{name}: cannot decode audio file (corrupt or unsupported format): {msg}") from e


def load_audio(source: Any, target_sr: int = SAMPLE_RATE, *, channels_first: bool | None = None) -> np.ndarray:
    """Load audio as a contiguous 1-D float32 array at ``target_sr`` (mono).

    ``source`` may be:
      * a path (``str``/``PathLike``), raw file ``bytes`` or a binary file object — decoded with soundfile,
        or with PyAV (FFmpeg) when soundfile cannot read it;
      * a ``(array, sample_rate)`` tuple — resampled from ``sample_rate``;
      * a 1-D/2-D ``np.ndarray`` (or torch tensor / list) — assumed to be at ``target_sr`` already.
    2-D arrays are down-mixed; the channel axis is the shorter one unless ``channels_first`` says.

    Raises ``AudioError`` for a missing/unreadable/corrupt file, empty audio, NaN/inf samples,
    or an unsupported dtype (complex, object, str, bool, ...).  Silence is not an error: see
    :func:`is_silent`.
    """
    if target_sr <= 0:
        raise AudioError(f"target_sr must be positive, got {target_sr}")
    sr = target_sr
    if isinstance(source, tuple):
        if len(source) != 2:
            raise AudioError(f"<tuple>: expected (array, sample_rate), got a tuple of length {len(source)}")
        source, sr = source
        if isinstance(sr, bool) or not isinstance(sr, (int, np.integer)) or sr <= 0:
            raise AudioError(f"{_describe(source)}: sample rate must be a positive integer, got {sr!r}")
        sr = int(sr)
    name = _describe(source)

    if isinstance(source, (str, os.PathLike, bytes, bytearray)) or hasattr(source, "read"):
        if sr != target_sr:
            raise AudioError(f"{name}: a sample rate cannot be given with a file; it is read from the file")
        data, sr = _read_file(source, name, target_sr)
        if data.shape[0] == 0 or data.shape[1] == 0:
            raise AudioError(f"{name}: audio file contains no samples")
        arr = _to_float32(data, name)  # soundfile can decode NaNs from float WAVs
        arr = _to_mono(arr, name, channels_first=False)
    else:
        if hasattr(source, "detach") and hasattr(source, "cpu"):  # torch.Tensor
            source = source.detach().cpu().numpy()
        try:
            arr = np.asarray(source)
        except Exception as e:
            raise AudioError(f"{name}: cannot convert to an array: {e}") from e
        if arr.size == 0:
            raise AudioError(f"{name}: audio is empty (no samples)")
        arr = _within_full_scale(_to_float32(arr, name), name)
        arr = _to_mono(arr, name, channels_first)

    arr = resample(arr, sr, target_sr)
    return np.ascontiguousarray(arr, dtype=np.float32)


def is_silent(audio: Any, threshold_db: float = -60.0) -> bool:
    """True if the RMS level of ``audio`` is below ``threshold_db`` dBFS (or it has no samples)."""
    a = np.asarray(audio.detach().cpu() if hasattr(audio, "detach") else audio, dtype=np.float64)
    if a.size == 0:
        return True
    rms = math.sqrt(float(np.mean(np.square(a))))
    return rms <= 10.0 ** (threshold_db / 20.0)


def split_into_windows(
    audio: np.ndarray, window_s: float = 30.0, sample_rate: int = SAMPLE_RATE, stride_s: float | None = None
) -> list[tuple[int, np.ndarray]]:
    """Split long audio into ``(start_sample, chunk)`` windows of ``window_s`` seconds.

    Windows start every ``stride_s`` seconds (default: ``window_s``, i.e. no overlap); the last
    chunk may be shorter (feature extraction pads it).  Chunks are views, not copies.  Audio no
    longer than one window gives a single ``(0, audio)``; empty audio gives ``[]``.
    """
    win = int(round(window_s * sample_rate))
    stride = win if stride_s is None else int(round(stride_s * sample_rate))
    if win <= 0 or stride <= 0:
        raise ValueError(f"window_s and stride_s must be positive, got {window_s}, {stride_s}")
    n = len(audio)
    out = []
    start = 0
    while start < n:
        out.append((start, audio[start:start + win]))
        if start + win >= n:
            break
        start += stride
    return out
