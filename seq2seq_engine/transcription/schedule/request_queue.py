"""Which window request goes to the engine next: inputs read as the queue runs dry, throughput or sequential."""
from __future__ import annotations

import collections
from typing import Deque, List, Optional

from seq2seq_engine.transcription.decode.decode_params import WindowPrompt
from seq2seq_engine.transcription.decode.fallback import Attempt, Verdict
from seq2seq_engine.transcription.input.windows import Window
from seq2seq_engine.transcription.options import TranscriptionOptions
from seq2seq_engine.transcription.schedule.input_source import InputSource, InputState
from seq2seq_engine.transcription.schedule.result_assembler import ResultAssembler
from seq2seq_engine.transcription.schedule.window_decoder import WindowDecoder, WindowRequest


class RequestQueue:
    """The call's requests not yet in the engine, and what each finished one adds.

    Inputs are opened in order when the queue runs dry. Without a language, an input's first window with speech
    goes first as a detection request. Throughput mode: once its language is known, an input becomes a *producer*
    whose next window is read whenever the queue runs dry (earlier inputs first, as they finish sooner). Sequential
    mode (condition_on_previous_text): window k+1 is read and queued when window k is final. A failed attempt is
    queued again at the next temperature, first in line. Silent windows are final at once. InputFailed comes out
    of `next_request` and of the requests' `on_done` when an input cannot be read.
    """

    def __init__(self, source: InputSource, decoder: WindowDecoder, assembler: ResultAssembler,
                 language: Optional[str], options: TranscriptionOptions) -> None:
        self.source, self.decoder, self.assembler = source, decoder, assembler
        self.language = language  # of every input; None: detected per input
        self.sequential = options.condition_on_previous_text
        self.prompt_reset_on_temperature = options.prompt_reset_on_temperature
        self.queue: Deque[WindowRequest] = collections.deque()
        self.producers: List[InputState] = []  # inputs whose next windows are read as the queue runs dry

    def next_request(self) -> Optional[WindowRequest]:
        """The next queued request, reading windows or opening inputs while the queue is empty; None when all
        inputs are read."""
        while not self.queue:
            if self.producers:
                self._produce(self.producers[0])
                continue
            state = self.source.open_next()
            if state is None:
                return None
            self._start(state)
        return self.queue.popleft()

    def forget(self, state: InputState) -> None:
        """The input failed: none of its windows are read any more (its queued requests are skipped as finished)."""
        if state in self.producers:
            self.producers.remove(state)

    def _start(self, state: InputState) -> None:
        state.language = self.language
        state.context = list(self.decoder.initial_tokens)
        if state.language is None:
            first = self._first_speech_window(state)
            if first is not None:
                self.queue.append(self.decoder.detection_request(state, first, self._queue_windows))
                return
        self._queue_windows(state)

    def _first_speech_window(self, state: InputState) -> Optional[Window]:
        """Read windows up to the first one that is not silent (silent ones are final at once)."""
        while True:
            window = self.source.read_window(state)
            if window is None or not window.silent:
                return window
            self._window_done(state, window, [])

    def _produce(self, state: InputState) -> None:
        """Queue the producer's next window (throughput mode); a producer that is read out leaves the list."""
        window = self.source.read_window(state)
        if window is None:
            self.producers.remove(state)
            self.assembler.finish_if_complete(state)
        elif window.silent:
            self._window_done(state, window, [])
        else:
            self._queue_window(state, window)

    def _queue_windows(self, state: InputState) -> None:
        """Queue the input's windows read so far (or the first in sequential mode) and make it a producer of the
        rest; silent ones are final at once."""
        if self.sequential:
            self._queue_next_sequential(state)
            return
        for window in state.windows:
            if window.index not in state.window_tokens:
                self._queue_window(state, window)
        self.producers.append(state)
        self.producers.sort(key=lambda producer: producer.index)  # earlier inputs first: they finish sooner

    def _queue_window(self, state: InputState, window: Window) -> None:
        """Throughput mode: the window's first attempt, conditioned on the initial prompt if it is the first."""
        previous = self.decoder.initial_tokens if window.index == 0 else []
        self.queue.append(self._attempt_request(state, window, self.decoder.prompt(state, window, previous), 0))

    def _queue_next_sequential(self, state: InputState) -> None:
        while True:
            k = len(state.window_tokens)
            window = state.windows[k] if k < len(state.windows) else self.source.read_window(state)
            if window is None:
                self.assembler.finish_if_complete(state)
                return
            if window.silent:
                self._window_done(state, window, [])
                continue
            prompt = self.decoder.prompt(state, window, state.context[state.context_start:])
            self.queue.append(self._attempt_request(state, window, prompt, 0))
            return

    def _attempt_request(self, state: InputState, window: Window, prompt: WindowPrompt,
                         attempt: int) -> WindowRequest:
        return self.decoder.attempt_request(
            state, window, prompt, attempt,
            on_attempt=lambda result: self._attempt_done(state, window, prompt, attempt, result))

    def _attempt_done(self, state: InputState, window: Window, prompt: WindowPrompt, attempt: int,
                      result: Attempt) -> None:
        """Re-queue a failed attempt at the next temperature (first in line), or keep it and move on."""
        outcome = self.decoder.verdict(result, attempt)
        if outcome is Verdict.RETRY:
            self.queue.appendleft(self._attempt_request(state, window, prompt, attempt + 1))
            return
        token_ids = [] if outcome is Verdict.SILENCE else prompt.forced + result.token_ids
        self._window_done(state, window, token_ids, result)
        if not self.sequential:
            self.assembler.finish_if_complete(state)
            return
        state.context.extend(state.window_tokens[window.index].token_ids)  # without dropped hallucinations
        if result.temperature > self.prompt_reset_on_temperature:
            state.context_start = len(state.context)  # openai-whisper: no prompt after a high-temperature window
        self._queue_next_sequential(state)

    def _window_done(self, state: InputState, window: Window, token_ids: List[int],
                     result: Optional[Attempt] = None) -> None:
        state.window_tokens[window.index] = self.decoder.final_tokens(state, window, token_ids, result)
        self.source.finish_window(state, window)
