"""The Silero VAD network (the `silero-vad` package's TorchScript file) run over whole recordings or streams of them."""
from __future__ import annotations

import functools
import importlib.util
import os
from typing import Any, Iterable, Iterator, Optional

import numpy as np
import torch

FRAME_SAMPLES = 512  # one speech probability per 32 ms at 16 kHz
CONTEXT_SAMPLES = 64  # each frame is fed with the last 64 samples of the frame before it
BLOCK_FRAMES = 4096  # frames per encoder call (~131 s of audio, ~10 MB of input): bounds memory on long files
JIT_FILE = "silero_vad.jit"


class VadUnavailable(RuntimeError):
    """The Silero VAD weights are not installed (the `silero-vad` package)."""


def model_path() -> str:
    """Path of the TorchScript model inside the installed `silero-vad` package.

    Found with `importlib.util.find_spec`, which locates the package without running its `__init__` (that imports
    `silero_vad.model`, which calls `torch.set_num_threads(1)` for the whole process).
    """
    spec = importlib.util.find_spec("silero_vad")
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in folders:
        path = os.path.join(folder, "data", JIT_FILE)
        if os.path.isfile(path):
            return path
    raise VadUnavailable("voice activity detection needs the Silero VAD weights: pip install silero-vad "
                         "(installed with seq2seq-engine; no torchaudio needed)")


class SileroVad:
    """Per-frame speech probabilities of 16 kHz mono audio.

    The TorchScript module is a streaming model: its `forward(frame, 16000)` takes one 512-sample frame, prepends the
    previous frame's last 64 samples and carries an LSTM state. Everything before the LSTM is per frame, so
    `probabilities` runs the module's own feature extractor and encoder over blocks of frames at once, the LSTM
    (an `nn.LSTM` holding the module's LSTMCell weights) over the sequence, and the module's output head on every
    frame: the same numbers as the frame-by-frame loop (within 2e-5) in one call per block (decisions §47).
    """

    def __init__(self, path: str) -> None:
        self.module: Any = torch.jit.load(path, map_location="cpu").eval()
        network = self.module._model  # the 16 kHz network; `_model_8k` is the 8 kHz one
        cell = network.decoder.rnn
        self.lstm = torch.nn.LSTM(cell.weight_ih.shape[1], cell.weight_hh.shape[1], batch_first=True)
        with torch.no_grad():
            for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
                getattr(self.lstm, f"{name}_l0").copy_(getattr(cell, name))
        self.lstm.eval()
        self.network = network

    @staticmethod
    def frames(audio: np.ndarray, first: int = 0, count: Optional[int] = None) -> torch.Tensor:
        """[count, 64 + 512]: frames first..first+count-1 (all by default), each 512-sample frame (the last
        zero-padded) after the 64 samples before it (zeros before the start)."""
        audio = np.asarray(audio, dtype=np.float32).reshape(-1)
        n_frames = -(-len(audio) // FRAME_SAMPLES)
        count = max(0, n_frames - first if count is None else min(count, n_frames - first))
        start = first * FRAME_SAMPLES - CONTEXT_SAMPLES  # sample index of padded[0]
        padded = np.zeros(count * FRAME_SAMPLES + CONTEXT_SAMPLES, dtype=np.float32)
        piece = audio[max(start, 0):start + len(padded)]
        padded[max(-start, 0):max(-start, 0) + len(piece)] = piece
        rows = np.lib.stride_tricks.as_strided(padded, shape=(count, CONTEXT_SAMPLES + FRAME_SAMPLES),
                                               strides=(FRAME_SAMPLES * 4, 4))
        return torch.from_numpy(np.ascontiguousarray(rows))

    def probabilities(self, audio: np.ndarray) -> np.ndarray:
        """Speech probability of every 32 ms frame of `audio` (16 kHz), as float32 [ceil(len / 512)]. The frames
        are cut block by block, so memory beyond the audio stays bounded on long recordings."""
        audio = np.asarray(audio, dtype=np.float32).reshape(-1)
        step = BLOCK_FRAMES * FRAME_SAMPLES
        return self.stream_probabilities(audio[start:start + step] for start in range(0, len(audio), step))

    def stream_probabilities(self, blocks: Iterable[np.ndarray]) -> np.ndarray:
        """`probabilities` of the audio `blocks` make laid end to end, each of BLOCK_FRAMES frames (the last may be
        shorter), read one at a time: only one block of audio is held, however long the stream."""
        out = list(self.iter_probabilities(blocks))
        return np.concatenate(out) if out else np.zeros(0, dtype=np.float32)

    @torch.inference_mode()
    def iter_probabilities(self, blocks: Iterable[np.ndarray]) -> Iterator[np.ndarray]:
        """The float32 probabilities of each non-empty block's frames (`stream_probabilities`), as each block is
        read: the LSTM state and the 64 samples of context carry over; no block is held past its own turn."""
        state, context = None, np.zeros(CONTEXT_SAMPLES, np.float32)
        for block in blocks:
            if not len(block):
                continue
            count = -(-len(block) // FRAME_SAMPLES)
            if count > BLOCK_FRAMES:
                raise ValueError(f"a block holds at most {BLOCK_FRAMES} frames, got {count}")
            padded = np.zeros(count * FRAME_SAMPLES + CONTEXT_SAMPLES, dtype=np.float32)
            padded[:CONTEXT_SAMPLES], padded[CONTEXT_SAMPLES:CONTEXT_SAMPLES + len(block)] = context, block
            context = padded[count * FRAME_SAMPLES:count * FRAME_SAMPLES + CONTEXT_SAMPLES].copy()
            del block
            rows = np.lib.stride_tricks.as_strided(padded, shape=(count, CONTEXT_SAMPLES + FRAME_SAMPLES),
                                                   strides=(FRAME_SAMPLES * 4, 4))
            features = self.network.encoder(self.network.run_extractors(torch.from_numpy(np.ascontiguousarray(rows))))
            hidden, state = self.lstm(features.squeeze(-1).unsqueeze(0), state)  # features: [frames, 128]
            probs = self.network.decoder.decoder(hidden[0].unsqueeze(-1))  # [frames, 1, 1]
            del padded, rows, features, hidden
            yield probs.reshape(-1).numpy()


@functools.lru_cache(maxsize=1)
def load_silero_vad() -> SileroVad:
    """The process's Silero VAD model, loaded on first use (~2 MB, ~0.1 s)."""
    return SileroVad(model_path())
