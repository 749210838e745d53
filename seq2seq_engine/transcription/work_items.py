"""Transcription work items and model facts: the engine's Whisper tokens, window length and features; the
bookkeeping of windows, inputs and per-window engine requests used by pipeline.py."""
from __future__ import annotations

import dataclasses
import math
import os
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from seq2seq_engine.audio import HOP_LENGTH, SAMPLE_RATE, log_mel_spectrogram, split_into_windows
from seq2seq_engine.beam_search_params import BeamSearchParams
from seq2seq_engine.sampling_params import SamplingParams
from seq2seq_engine.transcription.prompts import WhisperTokens
from seq2seq_engine.transcription.segments import WindowTokens


# ---------------------------------------------------------------------------------------------- model facts
def whisper_tokens_for(engine: Any) -> WhisperTokens:
    """The WhisperTokens of the engine's model (read once per transcribe call; no module-level cache)."""
    model_config = engine.model_config
    hf_config = model_config.hf_config
    if getattr(hf_config, "num_mel_bins", None) is None:
        raise ValueError(f"model {model_config.model!r} takes no audio (its config has no num_mel_bins): "
                         f"transcription needs a Whisper model")
    return WhisperTokens.from_model(engine.tokenizer, hf_config, model_config.model)


def window_samples(engine: Any) -> int:
    """Samples per window: the encoder sees 2 feature frames per position (30 s for the released models)."""
    return 2 * engine.model_config.max_encoder_len * HOP_LENGTH


def features_for(engine: Any, samples: np.ndarray) -> torch.Tensor:
    """Log-mel features [n_mels, frames] of one window (padded/trimmed to the window), as the engine would make."""
    n_mels = engine.model_config.hf_config.num_mel_bins
    return log_mel_spectrogram(samples, n_mels=n_mels, n_samples=window_samples(engine))


def clip_windows(audio: np.ndarray, clip_timestamps: Sequence[float],
                 window: int) -> List[Tuple[int, np.ndarray]]:
    """(start sample, samples) windows of at most `window` samples covering only the clips: `clip_timestamps` is
    start,end,start,end,... seconds (openai-whisper: rounded to 10 ms feature frames; a missing last end is the
    end of the audio; none at all is the whole input). Each clip is split from its own start."""
    frame = HOP_LENGTH  # samples per 10 ms feature frame
    points = [int(round(t * SAMPLE_RATE / frame)) * frame for t in clip_timestamps] or [0]
    if len(points) % 2:
        points.append(len(audio))
    windows = []
    for start, end in zip(points[::2], points[1::2]):
        start, end = min(start, len(audio)), min(end, len(audio))
        windows += [(start + offset, chunk) for offset, chunk in
                    split_into_windows(audio[start:end], window_s=window / SAMPLE_RATE)]
    return windows


# ---------------------------------------------------------------------------------------------- bookkeeping
@dataclasses.dataclass
class Window:
    index: int
    start_sample: int
    samples: np.ndarray
    silent: bool

    @property
    def offset(self) -> float:
        return self.start_sample / SAMPLE_RATE

    @property
    def duration(self) -> float:
        return len(self.samples) / SAMPLE_RATE


@dataclasses.dataclass
class InputState:
    index: int
    source: Any
    name: str
    samples_hint: int
    language: Optional[str] = None
    language_probability: Optional[float] = None
    duration: float = 0.0
    windows: List[Window] = dataclasses.field(default_factory=list)
    done: Dict[int, WindowTokens] = dataclasses.field(default_factory=dict)
    request_ids: set = dataclasses.field(default_factory=set)
    error: Optional[str] = None
    finished: bool = False
    # Sequential mode: the initial prompt and the kept windows' tokens; the prompt conditions on context[start:].
    context: List[int] = dataclasses.field(default_factory=list)
    context_start: int = 0


@dataclasses.dataclass
class WindowTask:
    """One engine request: `make_prompt` runs at admission (features are computed then, not before)."""

    owner: InputState
    make_prompt: Callable[[], dict]
    params: Union[SamplingParams, BeamSearchParams]
    on_done: Callable[[Any], None]


def is_single_input(audio: Any) -> bool:
    if isinstance(audio, (str, os.PathLike, bytes, bytearray, np.ndarray, torch.Tensor)):
        return True
    return (isinstance(audio, tuple) and len(audio) == 2 and isinstance(audio[1], (int, np.integer))
            and not isinstance(audio[1], bool) and not isinstance(audio[0], (str, os.PathLike)))


def describe_source(source: Any, index: int) -> str:
    if isinstance(source, (str, os.PathLike)):
        return os.fspath(source)
    return f"<input {index}>"


def samples_hint(source: Any) -> int:
    """16 kHz samples of the input, known without decoding where cheap (file header, array length; resampled
    lengths as load_audio makes them); 0 otherwise."""
    try:
        if isinstance(source, (str, os.PathLike)):
            import soundfile
            info = soundfile.info(os.fspath(source))
            return math.ceil(info.frames * SAMPLE_RATE / info.samplerate)
        if isinstance(source, tuple) and len(source) == 2:
            samples = np.asarray(source[0])
            return math.ceil(max(samples.shape) * SAMPLE_RATE / int(source[1]))
        if isinstance(source, (np.ndarray, torch.Tensor)):
            return int(max(source.shape))
    except Exception:  # noqa: BLE001 - a hint only; loading reports the real problem
        return 0
    return 0
