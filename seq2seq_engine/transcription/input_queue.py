"""From inputs to queued engine requests: each input read window by window as the engine has room, its language
detected on its first window with speech, its windows queued all at once (throughput) or one after the other
(sequential)."""
from __future__ import annotations

import collections
from typing import Any, Deque, Iterator, List, Optional, Sequence

import torch

from seq2seq_engine.audio import AudioError
from seq2seq_engine.transcription.decode_params import WindowPrompt
from seq2seq_engine.transcription.language import detection_params, detection_prompt, parse_detection
from seq2seq_engine.transcription.window_source import WindowReader
from seq2seq_engine.transcription.work_items import InputState, Window, WindowTask, describe_source, samples_hint


class InputQueue:
    """The reading and queueing half of a transcription; job.py's `TranscriptionJob` adds the engine requests and
    each window's decoding, and provides what is used here: `options`, `plan`, `tokens`, `language`, `vad`,
    `window_samples`, `progress`, `_window_task`, `_prompt`, `_window_done`, `_features`, `_fail` and `_maybe_finish`.

    Inputs are opened in order when the queue runs dry. An input's windows come from its WindowReader (streamed
    30 s cuts, or VAD-packed speech), read only as far as requests need them. Throughput mode: once its language is
    known, an input becomes a *producer* whose next window is read whenever the queue runs dry (earlier inputs
    first, as they finish sooner). Sequential mode: window k+1 is read and queued when window k is final.
    """

    options: Any
    plan: Any
    tokens: Any
    progress: Any
    language: Optional[str]
    vad: Any
    window_samples: int

    def _init_queue(self, sources: Sequence[Any]) -> None:
        self.inputs = [InputState(i, source, describe_source(source, i), samples_hint(source))
                       for i, source in enumerate(sources)]
        self._pending_inputs: Iterator[InputState] = iter(self.inputs)
        self.queue: Deque[WindowTask] = collections.deque()
        self.producers: List[InputState] = []  # inputs whose next windows are read as the queue runs dry

    def _next_task(self) -> Optional[WindowTask]:
        """The next queued request, reading windows or opening inputs while the queue is empty; None when all
        inputs are read."""
        while not self.queue:
            if self.producers:
                self._produce(self.producers[0])
                continue
            item = next(self._pending_inputs, None)
            if item is None:
                return None
            self._start(item)
        return self.queue.popleft()

    def _start(self, item: InputState) -> None:
        item.reader = WindowReader(item.source, self.window_samples, self.options.clip_timestamps, self._vad_for(item))
        item.language = self.language
        item.context = list(self.plan.initial_tokens)
        if item.language is None:
            first = self._first_speech_window(item)
            if item.finished:
                return
            if first is not None:
                self.queue.append(WindowTask(item, lambda: detection_prompt(self.tokens, self._features(first)),
                                             detection_params(self.tokens), lambda out: self._detected(item, out)))
                return
        self._queue_windows(item)

    def _vad_for(self, item: InputState) -> Any:
        """The input's VAD options: with vad_filter None, only for an input longer than one window (or of unknown
        length: long recordings are where pauses and noise make Whisper write words nobody said)."""
        if self.options.vad_filter is None and 0 < item.samples_hint <= self.window_samples:
            return None
        return self.vad

    def _first_speech_window(self, item: InputState) -> Optional[Window]:
        """Read windows up to the first one that is not silent (silent ones are done at once)."""
        while not item.finished:
            window = self._read_window(item)
            if window is None or not window.silent:
                return window
            self._window_done(item, window, [])
        return None

    def _read_window(self, item: InputState) -> Optional[Window]:
        """The input's next window; None when all are read or reading failed (then the input failed)."""
        try:
            window = item.next_window(self.options.skip_silence)
        except (AudioError, ValueError, TypeError) as error:  # this input is unusable; the others go on
            self._fail(item, str(error))
            return None
        total_change, skipped = item.account()
        self.progress.add_total(total_change)
        self.progress.update(skipped)  # audio outside the clips, or not speech, is done
        return window

    def _produce(self, item: InputState) -> None:
        """Queue the producer's next window (throughput mode); a producer that is read out leaves the list."""
        window = self._read_window(item) if not item.finished else None
        if window is None:
            if item in self.producers:  # a failed input has left already
                self.producers.remove(item)
            self._maybe_finish(item)
        elif window.silent:
            self._window_done(item, window, [])
        else:
            self._queue_window(item, window)

    def _detected(self, item: InputState, output: Any) -> None:
        try:
            item.language, item.language_probability = parse_detection(output, self.tokens)
        except ValueError as error:
            self._fail(item, str(error))
            return
        self._queue_windows(item)

    def _queue_windows(self, item: InputState) -> None:
        """Queue the input's windows read so far (or the first in sequential mode) and make it a producer of the
        rest; silent ones finish at once."""
        if self.options.condition_on_previous_text:
            self._queue_next_sequential(item)
            return
        for window in item.windows:
            if window.index not in item.done:
                self._queue_window(item, window)
        self.producers.append(item)
        self.producers.sort(key=lambda producer: producer.index)  # earlier inputs first: they finish sooner

    def _queue_window(self, item: InputState, window: Window) -> None:
        """Throughput mode: the window's first attempt, conditioned on the initial prompt if it is the first."""
        previous = self.plan.initial_tokens if window.index == 0 else []
        self.queue.append(self._window_task(item, window, self._prompt(item, window, previous), 0))

    def _queue_next_sequential(self, item: InputState) -> None:
        while not item.finished:
            k = len(item.done)
            window = item.windows[k] if k < len(item.windows) else self._read_window(item)
            if window is None:
                self._maybe_finish(item)
                return
            if window.silent:
                self._window_done(item, window, [])
                continue
            prompt = self._prompt(item, window, item.context[item.context_start:])
            self.queue.append(self._window_task(item, window, prompt, 0))
            return

    # Provided by the pipeline.
    def _window_task(self, item: InputState, window: Window, prompt: WindowPrompt, attempt: int) -> WindowTask:
        raise NotImplementedError

    def _prompt(self, item: InputState, window: Window, previous: List[int]) -> WindowPrompt:
        raise NotImplementedError

    def _window_done(self, item: InputState, window: Window, token_ids: List[int], result: Any = None) -> None:
        raise NotImplementedError

    def _features(self, window: Window) -> torch.Tensor:
        raise NotImplementedError

    def _fail(self, item: InputState, message: str) -> None:
        raise NotImplementedError

    def _maybe_finish(self, item: InputState) -> None:
        raise NotImplementedError
