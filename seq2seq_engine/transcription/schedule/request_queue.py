"""Which window's request goes to the engine next: inputs read as the queue runs dry, throughput or sequential."""
from __future__ import annotations

import collections
from typing import Deque, List, Optional

from seq2seq_engine.transcription.input.windows import Window
from seq2seq_engine.transcription.options import TranscriptionOptions
from seq2seq_engine.transcription.schedule.input_source import InputSource, InputState
from seq2seq_engine.transcription.schedule.result_assembler import ResultAssembler
from seq2seq_engine.transcription.schedule.window_decoder import WindowDecoder
from seq2seq_engine.transcription.schedule.window_machine import Phase, WindowMachine, WindowRequest


class RequestQueue:
    """The call's WindowMachines waiting to send a request, in the order they send them, and what a finished window
    adds to its input.

    Inputs are opened in order when the queue runs dry. Without a language, an input's first window with speech
    goes first (its machine detects the language). Throughput mode: once its language is known, an input becomes a
    *producer* whose next window is read whenever the queue runs dry (earlier inputs first, as they finish sooner).
    Sequential mode (condition_on_previous_text): window k+1 is read and queued when window k is final, conditioned
    on the text kept so far. A machine that retries goes first in line (`advance`). Silent windows are final at
    once. InputFailed comes out of `next_request` and `advance` when an input cannot be read.
    """

    def __init__(self, source: InputSource, decoder: WindowDecoder, assembler: ResultAssembler,
                 language: Optional[str], options: TranscriptionOptions) -> None:
        self.source, self.decoder, self.assembler = source, decoder, assembler
        self.language = language  # of every input; None: detected per input
        self.sequential = options.condition_on_previous_text
        self.prompt_reset_on_temperature = options.prompt_reset_on_temperature
        self.queue: Deque[WindowMachine] = collections.deque()
        self.producers: List[InputState] = []  # inputs whose next windows are read as the queue runs dry

    def next_request(self) -> Optional[WindowRequest]:
        """The request of the next queued machine, reading windows or opening inputs while the queue is empty;
        None when all inputs are read."""
        while not self.queue:
            if self.producers:
                self._produce(self.producers[0])
                continue
            state = self.source.open_next()
            if state is None:
                return None
            self._start(state)
        return self.queue.popleft().next_request()

    def advance(self, machine: WindowMachine) -> None:
        """Place a machine that took its request's output: a retry first in line, a window whose input's language
        is now known last in line (throughput: the input becomes a producer), a final window into its input. Its
        words are aligned before (the job's end_of_step runs align_words over the step's machines)."""
        if machine.phase is Phase.WORDS:
            raise RuntimeError(f"window {machine.window.index} of {machine.state.name} waits for its words")
        if machine.retrying:
            self.queue.appendleft(machine)
        elif machine.done:
            self._attempted_window_done(machine)
        else:
            self.queue.append(machine)
            if not self.sequential:
                self._add_producer(machine.state)

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
                self.queue.append(self._machine(state, first))  # it detects the language first
                return
        if self.sequential:
            self._queue_next_sequential(state)
        else:
            self._add_producer(state)

    def _machine(self, state: InputState, window: Window) -> WindowMachine:
        """The window's machine, conditioned on the text kept so far (sequential), or on the initial prompt if it is
        the input's first window (throughput)."""
        if self.sequential:
            previous = state.context[state.context_start:]
        else:
            previous = self.decoder.initial_tokens if window.index == 0 else []
        return WindowMachine(self.decoder, state, window, previous)

    def _first_speech_window(self, state: InputState) -> Optional[Window]:
        """Read windows up to the first one that is not silent (silent ones are final at once)."""
        while True:
            window = self.source.read_window(state)
            if window is None or not window.silent:
                return window
            self._window_done(self._machine(state, window))

    def _add_producer(self, state: InputState) -> None:
        self.producers.append(state)
        self.producers.sort(key=lambda producer: producer.index)  # earlier inputs first: they finish sooner

    def _produce(self, state: InputState) -> None:
        """Queue the producer's next window (throughput mode); a producer that is read out leaves the list."""
        window = self.source.read_window(state)
        if window is None:
            self.producers.remove(state)
            self.assembler.finish_if_complete(state)
            return
        machine = self._machine(state, window)
        if machine.done:
            self._window_done(machine)
        else:
            self.queue.append(machine)

    def _queue_next_sequential(self, state: InputState) -> None:
        while True:
            k = len(state.window_tokens)
            window = state.windows[k] if k < len(state.windows) else self.source.read_window(state)
            if window is None:
                self.assembler.finish_if_complete(state)
                return
            machine = self._machine(state, window)
            if not machine.done:
                self.queue.append(machine)
                return
            self._window_done(machine)

    def _attempted_window_done(self, machine: WindowMachine) -> None:
        """A decoded window is final: its input is finished, or (sequential) its text conditions the next window."""
        state = machine.state
        self._window_done(machine)
        if not self.sequential:
            self.assembler.finish_if_complete(state)
            return
        state.context.extend(machine.tokens.token_ids)  # without dropped hallucinations
        if machine.result.temperature > self.prompt_reset_on_temperature:
            state.context_start = len(state.context)  # openai-whisper: no prompt after a high-temperature window
        self._queue_next_sequential(state)

    def _window_done(self, machine: WindowMachine) -> None:
        machine.state.window_tokens[machine.window.index] = machine.tokens
        self.source.finish_window(machine.state, machine.window)
