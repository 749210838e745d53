"""Transcription work items: the engine's Whisper tokens and window features, and pipeline.py's bookkeeping."""
from __future__ import annotations

import dataclasses
import math
import os
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from seq2seq_engine.audio import (HOP_LENGTH, SAMPLE_RATE, encoder_window_samples, is_silent, log_mel_spectrogram,
                                  split_into_windows)
from seq2seq_engine.audio.vad import VadOptions
from seq2seq_engine.beam_search_params import BeamSearchParams
from seq2seq_engine.sampling_params import SamplingParams
from seq2seq_engine.transcription.prompts import WhisperTokens
from seq2seq_engine.transcription.segments import WindowTokens
from seq2seq_engine.transcription.vad_windows import TimeMap, detect_speech_windows


# ---------------------------------------------------------------------------------------------- model facts
def whisper_tokens_for(engine: Any) -> WhisperTokens:
    """The WhisperTokens of the engine's model (read once per transcribe call; no module-level cache)."""
    model_config = engine.model_config
    hf_config = model_config.hf_config
    if getattr(hf_config, "num_mel_bins", None) is None:
        raise ValueError(f"model {model_config.model!r} takes no audio (its config has no num_mel_bins): "
                         f"transcription needs a Whisper model")
    return WhisperTokens.from_model(engine.tokenizer, hf_config, model_config.model)


def features_for(engine: Any, samples: np.ndarray) -> torch.Tensor:
    """Log-mel features [n_mels, frames] of one window (padded/trimmed to the window), as the engine would make."""
    n_mels = engine.model_config.hf_config.num_mel_bins
    return log_mel_spectrogram(samples, n_mels=n_mels,
                               n_samples=encoder_window_samples(engine.model_config.max_encoder_len))


def clip_spans(clip_timestamps: Sequence[float], num_samples: Optional[int]) -> List[Tuple[int, Optional[int]]]:
    """[start, end) samples of each clip: `clip_timestamps` is start,end,start,end,... seconds (openai-whisper:
    rounded to 10 ms feature frames; a missing last end is the end of the audio, None when `num_samples` is not
    known yet; none at all is the whole input)."""
    frame = HOP_LENGTH  # samples per 10 ms feature frame
    points: List[Optional[int]] = [int(round(t * SAMPLE_RATE / frame)) * frame for t in clip_timestamps] or [0]
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


# ---------------------------------------------------------------------------------------------- bookkeeping
@dataclasses.dataclass
class Window:
    index: int
    start_sample: int
    samples: np.ndarray
    silent: bool
    time_map: Optional[TimeMap] = None  # packed speech regions (vad_filter): window time -> input time

    @property
    def offset(self) -> float:
        return self.start_sample / SAMPLE_RATE

    @property
    def duration(self) -> float:
        return len(self.samples) / SAMPLE_RATE


def make_windows(audio: np.ndarray, window_samples: int, skip_silence: bool, vad: Optional[VadOptions],
                 clip_timestamps: Sequence[float] = ()) -> List[Window]:
    """An input's windows: consecutive 30 s cuts of each clip (the whole input without clip_timestamps), or with
    `vad` the speech regions inside the clips packed into windows (no window when there is no speech). With
    `skip_silence`, windows below -60 dBFS are marked silent (not decoded)."""
    if vad is None:
        cuts = [(start, chunk, None) for start, chunk in clip_windows(audio, clip_timestamps, window_samples)]
    else:
        within = [(s, min(e, len(audio))) for s, e in clip_spans(clip_timestamps, len(audio))]
        cuts = [(w.time_map.start_sample, w.samples, w.time_map)
                for w in detect_speech_windows(audio, vad, window_samples, within if clip_timestamps else None)]
    return [Window(k, start, chunk, skip_silence and is_silent(chunk), time_map)
            for k, (start, chunk, time_map) in enumerate(cuts)]


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
