"""The inputs of one transcribe call, opened in order and read window by window, with the audio progress bar."""
from __future__ import annotations

import dataclasses
import math
import os
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import torch

from seq2seq_engine.audio import SAMPLE_RATE, AudioError, is_silent
from seq2seq_engine.audio.base import AudioTooLong
from seq2seq_engine.audio.stream import samples_hint as file_samples_hint
from seq2seq_engine.audio.vad import VadOptions
from seq2seq_engine.transcription.input.window_source import WindowReader
from seq2seq_engine.transcription.input.windows import Window
from seq2seq_engine.transcription.output.results import FailureKind
from seq2seq_engine.transcription.schedule.progress import audio_progress
from seq2seq_engine.transcription.timing.segments import WindowTokens


@dataclasses.dataclass
class InputState:
    """One input of the call: where its reading, its windows' decoding and its result stand."""

    index: int
    source: Any
    name: str
    samples_hint: int
    language: Optional[str] = None
    language_probability: Optional[float] = None
    duration: float = 0.0
    windows: List[Window] = dataclasses.field(default_factory=list)  # read so far (released once final)
    window_tokens: Dict[int, WindowTokens] = dataclasses.field(default_factory=dict)  # of the final windows
    request_ids: set = dataclasses.field(default_factory=set)  # its requests in the engine
    error: Optional[str] = None
    failure: Optional[FailureKind] = None  # the kind of `error`
    finished: bool = False
    # Sequential mode: the initial prompt and the kept windows' tokens; the prompt conditions on context[start:].
    context: List[int] = dataclasses.field(default_factory=list)
    context_start: int = 0
    reader: Optional[WindowReader] = None  # the windows not read yet
    all_read: bool = False
    samples_counted: int = 0  # of this input in the progress total
    samples_progressed: int = 0  # of this input counted done (windows final, audio no window covers)
    skipped_counted: int = 0  # of the reader's skipped samples, those counted done already

    def __post_init__(self) -> None:
        self.samples_counted = self.samples_hint


class InputFailed(Exception):
    """The input cannot be transcribed (its audio, or a request the engine refused: `kind`); the call's others go
    on."""

    def __init__(self, state: InputState, message: str, kind: FailureKind = FailureKind.ENGINE) -> None:
        super().__init__(message)
        self.state, self.kind = state, kind


class InputSource:
    """Each input's windows, read only as far as requests need them.

    Inputs open in order (`open_next`). An input's windows come from its WindowReader: 30 s cuts streamed from the
    decoder (only the `clip_timestamps` spans when given), or its VAD-packed speech. The progress bar counts 16 kHz
    samples: the total starts from the inputs' header lengths and follows each input's real length as it is read;
    audio no window covers counts as done when the reader knows it, a window when it is final (`finish_window`).
    """

    def __init__(self, sources: Sequence[Any], window_samples: int, clip_timestamps: Sequence[float],
                 vad: Optional[VadOptions], vad_filter: Optional[bool], skip_silence: bool, use_tqdm: bool,
                 max_seconds: Optional[float] = None) -> None:
        self.window_samples, self.clip_timestamps, self.max_seconds = window_samples, clip_timestamps, max_seconds
        self.vad, self.vad_filter, self.skip_silence = vad, vad_filter, skip_silence
        self.inputs = [InputState(i, source, describe_source(source, i), samples_hint(source))
                       for i, source in enumerate(sources)]
        self._unopened: Iterator[InputState] = iter(self.inputs)
        self.progress = audio_progress(sum(state.samples_hint for state in self.inputs), enabled=use_tqdm)

    def open_next(self) -> Optional[InputState]:
        """The next input, ready to be read; None when all are open."""
        state = next(self._unopened, None)
        if state is not None:
            state.reader = WindowReader(state.source, self.window_samples, self.clip_timestamps, self._vad_for(state),
                                        self.max_seconds)
        return state

    def read_window(self, state: InputState) -> Optional[Window]:
        """The input's next window (None once all are read); InputFailed when its audio cannot be read."""
        try:
            window = self._next_window(state)
        except (AudioError, ValueError, TypeError) as error:
            kind = FailureKind.AUDIO_TOO_LONG if isinstance(error, AudioTooLong) else FailureKind.AUDIO
            raise InputFailed(state, str(error), kind) from error
        total_change, skipped = self._account(state)
        self.progress.add_total(total_change)
        self.progress.update(skipped)  # audio outside the clips, or not speech, is done
        return window

    def finish_window(self, state: InputState, window: Window) -> None:
        """The window is final: its samples are released and it counts as done."""
        window.release()
        state.samples_progressed += window.num_samples
        self.progress.update(window.num_samples)

    def drop_input(self, state: InputState) -> None:
        """The input failed: the rest of it counts as done, its reader closes and its windows' samples go."""
        self.progress.update(max(0, state.samples_counted - state.samples_progressed))
        if state.reader is not None:
            state.reader.close()
        for window in state.windows:
            window.release()

    def close(self) -> None:
        """Close the progress bar and every input's reader (also when the call stopped early)."""
        self.progress.close()
        for state in self.inputs:
            if state.reader is not None:
                state.reader.close()

    def _vad_for(self, state: InputState) -> Optional[VadOptions]:
        """The input's VAD options: with vad_filter None, only for an input longer than one window (or of unknown
        length: long recordings are where pauses and noise make Whisper write words nobody said)."""
        if self.vad_filter is None and 0 < state.samples_hint <= self.window_samples:
            return None
        return self.vad

    def _next_window(self, state: InputState) -> Optional[Window]:
        """The next window from the input's reader (None once all are read); AudioError when decoding fails."""
        reader = state.reader
        cut = reader.next_window() if reader is not None else None
        if reader is not None:
            state.duration = reader.position / SAMPLE_RATE
        if cut is None:
            state.all_read = True
            return None
        start, samples, time_map = cut
        window = Window(len(state.windows), start, samples, self.skip_silence and is_silent(samples), time_map)
        state.windows.append(window)
        return window

    @staticmethod
    def _account(state: InputState) -> Tuple[int, int]:
        """(change of the input's share of the progress total, samples newly done without decoding): the share is
        its length once read, else at least the hint or what was read; audio no window covers counts as done."""
        position = state.reader.position if state.reader is not None else 0
        skipped = state.reader.skipped if state.reader is not None else 0
        samples = position if state.all_read else max(state.samples_counted, position)
        delta, state.samples_counted = samples - state.samples_counted, samples
        done = max(0, skipped - state.skipped_counted)
        state.skipped_counted += done
        state.samples_progressed += done
        return delta, done


def is_single_input(audio: Any) -> bool:
    """Whether `audio` is one input (a path, bytes, an array, an (array, sample_rate) tuple) rather than a list."""
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
            samples, rate = np.asarray(source[0]), int(source[1])
            return math.ceil(max(samples.shape) * SAMPLE_RATE / rate) if rate > 0 else 0
        if isinstance(source, (np.ndarray, torch.Tensor)):
            return int(max(source.shape))
    except Exception:  # noqa: BLE001 - a hint only; loading reports the real problem
        return 0
    return 0
