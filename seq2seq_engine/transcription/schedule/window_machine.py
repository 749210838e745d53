"""One window's life as a state machine: language detection, attempt k and its verdict, final tokens, words."""
from __future__ import annotations

import dataclasses
import enum
from typing import Any, List, Optional, Sequence

import torch

from seq2seq_engine.transcription.decode.decode_params import NoSpeechProbe, Params, WindowPrompt
from seq2seq_engine.transcription.decode.fallback import Attempt, Verdict
from seq2seq_engine.transcription.decode.language import detection_params, parse_detection
from seq2seq_engine.transcription.input.windows import Window
from seq2seq_engine.transcription.schedule.input_source import InputFailed, InputState
from seq2seq_engine.transcription.schedule.window_decoder import WindowDecoder
from seq2seq_engine.transcription.timing.segments import WindowTokens
from seq2seq_engine.transcription.timing.word_timestamps import WindowToAlign
from seq2seq_engine.transcription.timing.words import WordTiming


class Phase(enum.Enum):
    LANGUAGE = "language"  # a request detects the input's language on this window
    ATTEMPT = "attempt"    # a request decodes the window at its attempt'th temperature
    WORDS = "words"        # the kept tokens are final; their words wait for the alignment pass (align_words)
    DONE = "done"          # `tokens` is what the window leaves


@dataclasses.dataclass(frozen=True)
class WindowRequest:
    """The engine request a machine needs now; its prompt is made at admission (`engine_prompt`: the features are
    computed then, not before); the finished RequestOutput goes to `machine.on_output`."""

    machine: "WindowMachine"
    prompt_token_ids: List[int]
    params: Params

    @property
    def input_state(self) -> InputState:
        return self.machine.state

    def engine_prompt(self) -> dict:
        return {"prompt_token_ids": self.prompt_token_ids,
                "multi_modal_data": {"input_features": self.machine.features()}}


class WindowMachine:
    """One window of an input, from its first request to its WindowTokens.

    Phases: LANGUAGE (the input's language is not known: a 1-token detection request on this window) -> ATTEMPT k
    (the request at the k'th temperature, conditioned on `previous`; its output is scored and judged: a retry stays
    in ATTEMPT at k + 1, else its tokens are kept, none for silence) -> WORDS (the kept tokens want their words:
    `alignment()` for the pass, `take_words` with its words) -> DONE (`tokens`). A silent window is DONE at once
    without text. `next_request()` is the request the phase needs (None in WORDS and DONE); `on_output(output)`
    advances on that request's finished RequestOutput. It changes only its window's state and, on detection, the
    input's language; where its request goes next and what a final window adds are the RequestQueue's.
    """

    def __init__(self, decoder: WindowDecoder, state: InputState, window: Window, previous: Sequence[int]) -> None:
        self.decoder, self.state, self.window = decoder, state, window
        self.previous = list(previous)  # the text the attempts are conditioned on
        self.prompt: Optional[WindowPrompt] = None
        self.attempt = 0
        self.result: Optional[Attempt] = None  # the last attempt's
        self.tokens: Optional[WindowTokens] = None
        self._probe: Optional[NoSpeechProbe] = None  # P(<|nospeech|>) of the attempt in flight
        if window.silent:
            self._keep([], None)
        elif state.language is None:
            self.phase = Phase.LANGUAGE
        else:
            self._start_attempts()

    @property
    def done(self) -> bool:
        return self.phase is Phase.DONE

    @property
    def retrying(self) -> bool:
        """Whether the next request is a retry (an attempt after the first)."""
        return self.phase is Phase.ATTEMPT and self.attempt > 0

    def features(self) -> torch.Tensor:
        return self.decoder.features(self.window)

    def next_request(self) -> Optional[WindowRequest]:
        """The engine request the window needs now (None when it needs none)."""
        if self.phase is Phase.LANGUAGE:
            return WindowRequest(self, self.decoder.tokens.detection_prompt(), detection_params(self.decoder.tokens))
        if self.phase is Phase.ATTEMPT:
            params, self._probe = self.decoder.attempt_params(self.state, self.window, self.prompt, self.attempt)
            return WindowRequest(self, self.prompt.token_ids, params)
        return None

    def on_output(self, output: Any) -> None:
        """Advance on the finished output of `next_request()`'s request. InputFailed when a detection names no
        language."""
        if self.phase is Phase.LANGUAGE:
            try:
                self.state.language, self.state.language_probability = parse_detection(output, self.decoder.tokens)
            except ValueError as error:
                raise InputFailed(self.state, str(error)) from error
            self._start_attempts()
            return
        if self.phase is not Phase.ATTEMPT:
            raise RuntimeError(f"window {self.window.index} of {self.state.name} got an output in phase {self.phase}")
        self.result = self.decoder.attempt_of(output, self.window, self.attempt, self._probe)
        outcome = self.decoder.verdict(self.result, self.attempt)
        if outcome is Verdict.RETRY:
            self.attempt += 1
            return
        self._keep([] if outcome is Verdict.SILENCE else self.prompt.forced + self.result.token_ids, self.result)

    def alignment(self) -> WindowToAlign:
        """WORDS: what the alignment pass reads (call it before the window's samples are released)."""
        return WindowToAlign(self.features(), self.tokens.token_ids, self.state.language,
                             self.decoder.options.task, self.window.duration)

    def take_words(self, words: List[List[WordTiming]]) -> None:
        """WORDS -> DONE: the window's words per segment (WordAligner)."""
        self.tokens = self.decoder.with_words(self.tokens, words)
        self.phase = Phase.DONE

    def _start_attempts(self) -> None:
        self.prompt = self.decoder.prompt(self.state, self.window, self.previous)
        self.phase = Phase.ATTEMPT

    def _keep(self, token_ids: List[int], result: Optional[Attempt]) -> None:
        """The window's final tokens: DONE, or WORDS when their words are wanted (none to align without tokens)."""
        self.tokens = self.decoder.kept_tokens(self.window, token_ids, result)
        self.phase = Phase.DONE
        if self.decoder.wants_words(self.tokens):
            if token_ids:
                self.phase = Phase.WORDS
            else:
                self.take_words([])


def align_words(machines: Sequence[WindowMachine]) -> None:
    """The machines waiting for words (WORDS) get them from one WordAligner.windows_words call (the windows whose
    final attempt finished in the same engine step), in order; the others are left as they are."""
    waiting = [machine for machine in machines if machine.phase is Phase.WORDS]
    if not waiting:
        return
    words = waiting[0].decoder.aligner.windows_words([machine.alignment() for machine in waiting])
    for machine, window_words in zip(waiting, words):
        machine.take_words(window_words)
