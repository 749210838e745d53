"""One transcribe call as engine requests, driven by the engine's owner (pipeline.py's loop, the server's)."""
from __future__ import annotations

import logging
from typing import Any, List, Optional, Sequence, Tuple

from seq2seq_engine.audio import encoder_window_samples
from seq2seq_engine.engine_port import EnginePort
from seq2seq_engine.transcription.input.vad_windows import window_vad_options
from seq2seq_engine.transcription.options import TranscriptionOptions
from seq2seq_engine.transcription.output.results import Segment, TranscriptionResult
from seq2seq_engine.transcription.prompts import WhisperTokens, whisper_tokens_for
from seq2seq_engine.transcription.schedule.engine_requests import RequestsInFlight
from seq2seq_engine.transcription.schedule.in_flight import default_windows_in_flight
from seq2seq_engine.transcription.schedule.input_source import InputFailed, InputSource
from seq2seq_engine.transcription.schedule.request_queue import RequestQueue
from seq2seq_engine.transcription.schedule.result_assembler import ResultAssembler
from seq2seq_engine.transcription.schedule.window_decoder import WindowDecoder
from seq2seq_engine.transcription.schedule.window_machine import WindowMachine, WindowRequest, align_words

logger = logging.getLogger(__name__)


class TranscriptionJob:
    """One transcribe call's inputs through the engine. Whoever owns the engine drives it: `fill()` adds queued
    requests to the engine, `on_output(output)` takes every RequestOutput of a step (outputs of other requests are
    ignored) and `end_of_step()` acts on them once the step's are all in, `take_finished()` hands over the inputs
    finished so far; `in_flight` empty after a `fill()` means the job is done; `abort()` drops its engine requests,
    `close()` its progress bar and open files.

    Its parts: `source` (InputSource: the inputs' windows), one WindowMachine per window in decoding (its requests,
    verdicts, final tokens and words; `decoder`, WindowDecoder, holds what they share), `queue` (RequestQueue: which
    machine's request goes next), `in_flight` (RequestsInFlight: the requests in the engine) and `assembler`
    (ResultAssembler: the results). An input that fails (InputFailed) is failed across them.
    """

    def __init__(self, engine: EnginePort, sources: Sequence[Any], options: TranscriptionOptions,
                 stream: bool = False) -> None:
        self.engine = engine
        tokens = whisper_tokens_for(engine)
        language = _call_language(tokens, options)
        self.decoder = WindowDecoder(engine, tokens, options)
        window_samples = encoder_window_samples(engine.max_encoder_len)
        vad = window_vad_options(options.vad_filter, options.vad_parameters, window_samples)
        limit = options.max_in_flight or default_windows_in_flight(
            engine, tokens.max_new_tokens(0, options.max_new_tokens), self.decoder.plan.options.beam_width)
        self.source = InputSource(sources, window_samples, options.clip_timestamps, vad, options.vad_filter,
                                  options.skip_silence, options.use_tqdm, options.max_audio_seconds)
        self.assembler = ResultAssembler(self.source.inputs, tokens, self.decoder.decode_text, options.timestamps,
                                         stream)
        self.queue = RequestQueue(self.source, self.decoder, self.assembler, language, options)
        self.in_flight = RequestsInFlight(engine, limit, options.lora_request)
        self._outputs: List[Tuple[WindowRequest, Any]] = []  # the step's finished requests, until end_of_step

    def owns(self, request_id: str) -> bool:
        return request_id in self.in_flight

    def fill(self) -> None:
        """Add queued requests up to the in-flight limit, reading more windows and inputs as the queue runs dry
        (outputs taken since the last end_of_step are acted on first)."""
        self.end_of_step()
        while self.in_flight.has_room():
            try:
                request = self.queue.next_request()
                if request is None:
                    return
                if not request.input_state.finished:
                    self.in_flight.add(request)
            except InputFailed as failure:
                self._fail(failure)

    def on_output(self, output: Any) -> None:
        """Take one RequestOutput of the step; the job's finished requests wait for end_of_step."""
        request = self.in_flight.pop_finished(output)
        if request is not None:
            self._outputs.append((request, output))

    def end_of_step(self) -> None:
        """Act on the step's outputs: each window's machine advances on its output, the windows final now have
        their words aligned together (align_words), then each machine takes its place in the queue or its window
        in its input (RequestQueue.advance), in the order of the outputs; an input failing there fails in turn."""
        outputs, self._outputs = self._outputs, []
        advanced = self._advance(outputs)
        align_words([machine for machine, failure in advanced if failure is None])
        for machine, failure in advanced:
            if machine.state.finished:
                continue
            try:
                if failure is not None:
                    raise failure
                self.queue.advance(machine)
            except InputFailed as error:
                self._fail(error)

    def _advance(self, outputs: List[Tuple[WindowRequest, Any]]) -> List[Tuple[WindowMachine, Optional[InputFailed]]]:
        """(machine, the InputFailed its output brought or None) for each output of an input not failed (before it,
        in this step or earlier): the machine advanced on it."""
        advanced: List[Tuple[WindowMachine, Optional[InputFailed]]] = []
        failing = set()
        for request, output in outputs:
            state = request.input_state
            if state.finished or state.index in failing:
                continue
            try:
                if output.ignored_reason:
                    raise InputFailed(state, f"a request was ignored by the engine: {output.ignored_reason}")
                if output.error:     # failed inside a step and aborted alone (engine/step_isolation.py)
                    raise InputFailed(state, f"the engine failed on a window: {output.error}")
                request.machine.on_output(output)
                advanced.append((request.machine, None))
            except InputFailed as failure:
                failing.add(state.index)
                advanced.append((request.machine, failure))
        return advanced

    def take_finished(self) -> List[Tuple[int, TranscriptionResult]]:
        """(input index, result) of each input finished since the last call; its windows are dropped then."""
        return self.assembler.take_finished()

    def take_progress(self) -> List[Tuple[int, List[Segment], str]]:
        """With `stream`: each input's newly final leading windows (ResultAssembler.take_progress)."""
        return self.assembler.take_progress()

    def results(self) -> List[TranscriptionResult]:
        """Every input's result, in input order (once the job is done)."""
        return self.assembler.results()

    def abort(self) -> None:
        """Abort the job's engine requests still running (outputs not acted on yet are dropped)."""
        self._outputs = []
        self.in_flight.abort_all()

    def close(self) -> None:
        self.source.close()

    def _fail(self, failure: InputFailed) -> None:
        """The failed input gets the failure as its error; its requests are aborted and its audio dropped."""
        state, message = failure.state, str(failure)
        if state.finished:
            return
        self.in_flight.abort_input(state)
        self.source.drop_input(state)
        self.queue.forget(state)
        self.assembler.fail(state, message, failure.kind)
        logger.debug("transcription of %s failed: %s", state.name, message)


def _call_language(tokens: WhisperTokens, options: TranscriptionOptions) -> Optional[str]:
    """The language of every input ("en" for an English-only model), or None: detected per input. The task is
    checked against the model here."""
    language = tokens.language_code(options.language) if options.language is not None else None
    if not tokens.is_multilingual:
        language = "en"
    tokens.prompt(language or next(iter(tokens.language_ids), None), options.task, options.timestamps)
    return language
