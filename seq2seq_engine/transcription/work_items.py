"""Transcription work items: the engine's Whisper tokens and window features, and pipeline.py's bookkeeping."""
from __future__ import annotations

import dataclasses
import math
import os
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

import numpy as np
import torch

from seq2seq_engine.audio import SAMPLE_RATE, encoder_window_samples, is_silent, log_mel_spectrogram
from seq2seq_engine.audio.stream import samples_hint as file_samples_hint
from seq2seq_engine.beam_search_params import BeamSearchParams
from seq2seq_engine.sampling_params import SamplingParams
from seq2seq_engine.transcription.prompts import WhisperTokens
from seq2seq_engine.transcription.segments import WindowTokens
from seq2seq_engine.transcription.vad_windows import TimeMap
from seq2seq_engine.transcription.window_source import WindowReader


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


# ---------------------------------------------------------------------------------------------- bookkeeping
_NO_SAMPLES = np.zeros(0, np.float32)


@dataclasses.dataclass
class Window:
    index: int
    start_sample: int
    samples: np.ndarray
    silent: bool
    time_map: Optional[TimeMap] = None  # packed speech regions (vad_filter): window time -> input time
    num_samples: int = -1  # kept when the samples are released

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
        """Drop the samples once the window is decoded (its length and offset stay)."""
        self.samples = _NO_SAMPLES


@dataclasses.dataclass
class InputState:
    index: int
    source: Any
    name: str
    samples_hint: int
    language: Optional[str] = None
    language_probability: Optional[float] = None
    duration: float = 0.0
    windows: List[Window] = dataclasses.field(default_factory=list)  # read so far (released once decoded)
    done: Dict[int, WindowTokens] = dataclasses.field(default_factory=dict)
    request_ids: set = dataclasses.field(default_factory=set)
    error: Optional[str] = None
    finished: bool = False
    # Sequential mode: the initial prompt and the kept windows' tokens; the prompt conditions on context[start:].
    context: List[int] = dataclasses.field(default_factory=list)
    context_start: int = 0
    reader: Optional[WindowReader] = None  # the windows not read yet
    all_read: bool = False
    samples_counted: int = 0  # of this input in the progress total
    samples_progressed: int = 0  # of this input counted done (windows decoded, audio no window covers)
    skipped_counted: int = 0  # of the reader's skipped samples, those counted done already

    def __post_init__(self) -> None:
        self.samples_counted = self.samples_hint

    def next_window(self, skip_silence: bool) -> Optional[Window]:
        """The next window from the input's reader (None once all are read); AudioError when decoding fails."""
        cut = self.reader.next_window() if self.reader is not None else None
        if self.reader is not None:
            self.duration = self.reader.position / SAMPLE_RATE
        if cut is None:
            self.all_read = True
            return None
        start, samples, time_map = cut
        window = Window(len(self.windows), start, samples, skip_silence and is_silent(samples), time_map)
        self.windows.append(window)
        return window

    def account(self) -> Tuple[int, int]:
        """(change of this input's share of the progress total, samples newly done without decoding): the share is
        its length once read, else at least the hint or what was read; audio no window covers counts as done."""
        position = self.reader.position if self.reader is not None else 0
        skipped = self.reader.skipped if self.reader is not None else 0
        samples = position if self.all_read else max(self.samples_counted, position)
        delta, self.samples_counted = samples - self.samples_counted, samples
        done = max(0, skipped - self.skipped_counted)
        self.skipped_counted += done
        self.samples_progressed += done
        return delta, done

    def close_stream(self) -> None:
        if self.reader is not None:
            self.reader.close()

    def drop_audio(self) -> None:
        """Close the reader and release the samples of the windows read (the input failed)."""
        self.close_stream()
        for window in self.windows:
            window.release()


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
    """16 kHz samples of the input, known without decoding where cheap (file header or container metadata, array
    length; resampled lengths as load_audio makes them); 0 otherwise."""
    try:
        if isinstance(source, (str, os.PathLike)):
            return file_samples_hint(source)
        if isinstance(source, tuple) and len(source) == 2:
            samples = np.asarray(source[0])
            return math.ceil(max(samples.shape) * SAMPLE_RATE / int(source[1]))
        if isinstance(source, (np.ndarray, torch.Tensor)):
            return int(max(source.shape))
    except Exception:  # noqa: BLE001 - a hint only; loading reports the real problem
        return 0
    return 0
