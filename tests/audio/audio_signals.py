"""Test signals shared by the audio tests: sines, a spectral peak finder, and the noise/sweep/short/long/silence
clips the log-mel tests compare against HF's WhisperFeatureExtractor."""
from __future__ import annotations

import numpy as np

from seq2seq_engine.audio import N_SAMPLES, SAMPLE_RATE

SR = SAMPLE_RATE


def sine(freq: float, seconds: float, sr: int = SR, amp: float = 0.5) -> np.ndarray:
    t = np.arange(int(round(seconds * sr))) / sr
    return (amp * np.sin(2 * np.pi * freq * t)).astype(np.float32)


def peak_hz(x: np.ndarray, sr: int = SR) -> float:
    spec = np.abs(np.fft.rfft(x * np.hanning(len(x))))
    return float(np.fft.rfftfreq(len(x), 1.0 / sr)[int(np.argmax(spec))])


def signal(kind: str) -> np.ndarray:
    rng = np.random.default_rng(1234)
    if kind == "noise":
        return (0.3 * rng.standard_normal(N_SAMPLES)).astype(np.float32)
    if kind == "sweep":  # linear chirp 50 Hz -> 7.9 kHz over 30 s
        t = np.arange(N_SAMPLES) / SR
        f0, f1 = 50.0, 7900.0
        return (0.4 * np.sin(2 * np.pi * (f0 * t + (f1 - f0) * t**2 / (2 * 30.0)))).astype(np.float32)
    if kind == "short":  # 3.7 s, padded to 30 s
        return (sine(440.0, 3.7) + 0.05 * rng.standard_normal(int(3.7 * SR))).astype(np.float32)
    if kind == "long":  # 41 s, trimmed to 30 s
        return (0.2 * rng.standard_normal(41 * SR) + sine(1000.0, 41.0, amp=0.1)).astype(np.float32)
    if kind == "silence":
        return np.zeros(5 * SR, np.float32)
    raise ValueError(kind)
