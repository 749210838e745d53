"""One window of an input's audio as the engine decodes it, and its log-mel features."""
from __future__ import annotations

import dataclasses
from typing import Optional

import numpy as np
import torch

from seq2seq_engine.audio import SAMPLE_RATE, encoder_window_samples, log_mel_spectrogram
from seq2seq_engine.engine_port import EnginePort
from seq2seq_engine.transcription.input.vad_windows import TimeMap

_NO_SAMPLES = np.zeros(0, np.float32)


@dataclasses.dataclass
class Window:
    """The index'th window of an input: its samples from `start_sample` on (released once the window is final)."""

    index: int
    start_sample: int
    samples: np.ndarray
    silent: bool
    time_map: Optional[TimeMap] = None  # packed speech regions (vad_filter): window time -> input time
    num_samples: int = -1  # kept when the samples are released
    # log-mel features kept for the window's later requests and its alignment pass (WindowDecoder.features)
    features: Optional[torch.Tensor] = None

    def __post_init__(self) -> None:
        if self.num_samples < 0:
            self.num_samples = len(self.samples)

    @property
    def offset(self) -> float:
        return self.start_sample / SAMPLE_RATE

    @property
    def duration(self) -> float:
        return self.num_samples / SAMPLE_RATE

    def release(self) -> None:
        """Drop the samples (and features) once the window is final (its length and offset stay)."""
        self.samples, self.features = _NO_SAMPLES, None


def features_for(engine: EnginePort, samples: np.ndarray) -> torch.Tensor:
    """Log-mel features [n_mels, frames] of one window (padded/trimmed to the window), as the engine would make,
    computed on the engine's device (a window's STFT and mel product take 6–9 ms on two CPU cores, a GPU far less;
    the transcription keeps a bounded number of windows in flight, so the device holds a bounded number)."""
    return log_mel_spectrogram(samples, n_mels=engine.num_mel_bins, device=engine.device,
                               n_samples=encoder_window_samples(engine.max_encoder_len))
