"""Raw pcm16 audio (little-endian signed 16-bit mono) to the float32 16 kHz samples a live transcription takes."""
from __future__ import annotations

import numpy as np

from seq2seq_engine.audio import SAMPLE_RATE, resample

PCM_RATES = (16000, 24000)


def _check_rate(sample_rate: int) -> None:
    if sample_rate not in PCM_RATES:
        raise ValueError(f"sample_rate must be one of {PCM_RATES}, got {sample_rate!r}")


def pcm16_samples(data: bytes) -> np.ndarray:
    """The samples of `data` as float32 in [-1, 1) at its own rate; ValueError on an odd byte count."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"pcm16 data must be bytes, got {type(data).__name__}")
    if len(data) % 2:
        raise ValueError(f"pcm16 data must hold whole 2-byte samples, got {len(data)} bytes")
    return np.frombuffer(data, dtype="<i2").astype(np.float32) / 32768.0


def decode_pcm16(data: bytes, sample_rate: int) -> np.ndarray:
    """Little-endian s16 mono at `sample_rate` (16000 or 24000) -> float32 16 kHz. Each call resamples its own
    chunk (soxr HQ); for a stream of small 24 kHz chunks, Pcm16Stream resamples without seams between chunks."""
    _check_rate(sample_rate)
    samples = pcm16_samples(data)
    return samples if sample_rate == SAMPLE_RATE else resample(samples, sample_rate, SAMPLE_RATE)


class Pcm16Stream:
    """decode_pcm16 for consecutive chunks of one stream, at any rate from 8 to 192 kHz: a rate other than 16 kHz
    goes through one soxr stream resampler, so the output equals resampling the whole stream (up to the
    resampler's delay, flushed by `finish`)."""

    def __init__(self, sample_rate: int) -> None:
        if isinstance(sample_rate, bool) or not isinstance(sample_rate, int) or not 8000 <= sample_rate <= 192000:
            raise ValueError(f"sample_rate must be an integer from 8000 to 192000 Hz, got {sample_rate!r}")
        self.sample_rate = sample_rate
        self._resampler = None
        if sample_rate != SAMPLE_RATE:
            import soxr
            self._resampler = soxr.ResampleStream(sample_rate, SAMPLE_RATE, 1, dtype="float32", quality="HQ")

    def decode(self, data: bytes) -> np.ndarray:
        samples = pcm16_samples(data)
        return samples if self._resampler is None else self._resampler.resample_chunk(samples)

    def finish(self) -> np.ndarray:
        """The samples the resampler still holds (none at 16 kHz)."""
        if self._resampler is None:
            return np.zeros(0, dtype=np.float32)
        return self._resampler.resample_chunk(np.zeros(0, dtype=np.float32), last=True)
