"""Silero VAD in streaming form: chunks of any size in, one speech probability per completed 512-sample frame out,
the network's LSTM state and the 64-sample context carried from chunk to chunk."""
from __future__ import annotations

from typing import Any, Optional

import numpy as np
import torch

from seq2seq_engine.audio.silero import CONTEXT_SAMPLES, FRAME_SAMPLES, SileroVad, load_silero_vad


class StreamingVad:
    """Per-frame speech probabilities of one 16 kHz stream, fed in chunks: the same numbers `SileroVad.probabilities`
    gives for the whole signal (within 2e-5) for every frame completed so far. Shares the process's Silero model;
    each stream holds only its state (a partial frame, 64 samples of context, the LSTM's hidden and cell state)."""

    frame_samples = FRAME_SAMPLES

    def __init__(self, model: Optional[SileroVad] = None) -> None:
        self.model = model if model is not None else load_silero_vad()
        self.reset()

    def reset(self) -> None:
        """Forget the stream: the next sample is the first of a new one."""
        self._pending = np.zeros(0, dtype=np.float32)
        self._context = np.zeros(CONTEXT_SAMPLES, dtype=np.float32)
        self._state: Any = None
        self.frames_done = 0

    @torch.inference_mode()
    def feed(self, samples: np.ndarray) -> np.ndarray:
        """The speech probabilities (float32) of the frames `samples` complete, in order (none for a partial one)."""
        samples = np.asarray(samples, dtype=np.float32).reshape(-1)
        audio = np.concatenate([self._pending, samples]) if len(self._pending) else samples
        count = len(audio) // FRAME_SAMPLES
        self._pending = audio[count * FRAME_SAMPLES:].copy()
        if count == 0:
            return np.zeros(0, dtype=np.float32)
        padded = np.concatenate([self._context, audio[:count * FRAME_SAMPLES]])
        self._context = padded[-CONTEXT_SAMPLES:].copy()
        rows = np.lib.stride_tricks.as_strided(padded, shape=(count, CONTEXT_SAMPLES + FRAME_SAMPLES),
                                               strides=(FRAME_SAMPLES * 4, 4))
        network = self.model.network
        features = network.encoder(network.run_extractors(torch.from_numpy(np.ascontiguousarray(rows))))
        hidden, self._state = self.model.lstm(features.squeeze(-1).unsqueeze(0), self._state)
        probs = network.decoder.decoder(hidden[0].unsqueeze(-1)).reshape(-1)
        self.frames_done += count
        return probs.numpy().astype(np.float32, copy=False)
