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

logger = logging.getLogger(__name__)


class TranscriptionJob:
    """One transcribe call's inputs through the engine. Whoever owns the engine drives it: `fill()` adds queued
    requests to the engine, `on_output(output)` takes every RequestOutput of a step (outputs of other requests are
    ignored), `take_finished()` hands over the inputs finished so far; `in_flight` empty after a `fill()` means the
    job is done; `abort()` drops its engine requests, `close()` its progress bar and open files.

    Its parts: `source` (InputSource: the inputs' windows), `decoder` (WindowDecoder: each window's requests and
    final tokens), `queue` (RequestQueue: which request goes next), `in_flight` (RequestsInFlight: those in the
    engine) and `assembler` (ResultAssembler: the results). An input that fails (InputFailed) is failed across them.
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
        self.in_flight = RequestsInFlight(engine, limit)

    def owns(self, request_id: str) -> bool:
        return request_id in self.in_flight

    def fill(self) -> None:
        """Add queued requests up to the in-flight limit, reading more windows and inputs as the queue runs dry."""
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
        request = self.in_flight.pop_finished(output)
        if request is None or request.input_state.finished:
            return
        try:
            if output.ignored_reason:
                raise InputFailed(request.input_state,
                                  f"a request was ignored by the engine: {output.ignored_reason}")
            if output.error:     # failed inside a step and aborted alone (engine/step_isolation.py)
                raise InputFailed(request.input_state, f"the engine failed on a window: {output.error}")
            request.on_done(output)
        except InputFailed as failure:
            self._fail(failure)

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
        """Abort the job's engine requests still running."""
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
