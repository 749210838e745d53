"""A transcription job: one transcribe call's windows and attempts as engine requests, driven by the engine's owner
(pipeline.py's loop for `transcribe`, the server's engine loop for its audio endpoints)."""
from __future__ import annotations

import dataclasses
import itertools
import logging
import uuid
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

from seq2seq_engine.audio import AudioError, encoder_window_samples
from seq2seq_engine.transcription.decode_params import DecodePlan, WindowPrompt, attempt_seed
from seq2seq_engine.transcription.fallback import Attempt, Verdict, verdict
from seq2seq_engine.transcription.hallucination import drop_segments, hallucinated_segments
from seq2seq_engine.transcription.in_flight import default_windows_in_flight
from seq2seq_engine.transcription.input_queue import InputQueue
from seq2seq_engine.transcription.options import TranscriptionOptions
from seq2seq_engine.transcription.progress import audio_progress
from seq2seq_engine.transcription.results import Segment, TranscriptionResult
from seq2seq_engine.transcription.segments import WindowTokens, pieces_and_segments, stitch
from seq2seq_engine.transcription.vad_windows import window_vad_options
from seq2seq_engine.transcription.word_timestamps import WordAligner
from seq2seq_engine.transcription.words import WordTiming
from seq2seq_engine.transcription.work_items import InputState, Window, WindowTask, features_for, whisper_tokens_for

logger = logging.getLogger(__name__)

_REQUEST_PREFIX = "transcribe"


class TranscriptionJob(InputQueue):
    """One transcribe call's state: each window's attempts (input reading and queueing: InputQueue). Whoever owns
    the engine drives it: `fill()` queues requests into the engine, `on_output(output)` takes every RequestOutput of
    a step (outputs of other requests are ignored), `take_finished()` hands over the inputs finished so far;
    `in_flight` empty after a `fill()` means the job is done; `abort()` drops its engine requests, `close()` its
    progress bar and open files."""

    def __init__(self, engine: Any, sources: Sequence[Any], options: TranscriptionOptions,
                 stream: bool = False) -> None:
        self.engine, self.options, self.stream = engine, options, stream
        self._streamed: Dict[int, Tuple[int, bool]] = {}  # input -> (its leading windows streamed, any text yet)
        self.tokens = whisper_tokens_for(engine)
        self.language = self.tokens.language_code(options.language) if options.language is not None else None
        if not self.tokens.is_multilingual:
            self.language = "en"
        self.tokens.prompt(self.language or next(iter(self.tokens.language_ids), None), options.task,
                           options.timestamps)  # validates the task for this model
        self.plan = DecodePlan(engine, self.tokens, options)
        timed = options.word_timestamps or options.hallucination_silence_threshold is not None
        self.aligner = WordAligner(engine, self.tokens) if timed else None
        self.window_samples = encoder_window_samples(engine.model_config.max_encoder_len)
        self.vad = window_vad_options(options.vad_filter, options.vad_parameters, self.window_samples)
        self.max_in_flight = options.max_in_flight or default_windows_in_flight(
            engine, self.tokens.max_new_tokens(0, options.max_new_tokens), options.beam_width)
        self._init_queue(sources)
        self.in_flight: Dict[str, WindowTask] = {}
        self.newly_finished: List[InputState] = []
        self._ids = itertools.count()
        self._prefix = f"{_REQUEST_PREFIX}-{uuid.uuid4().hex[:8]}-"
        self.progress = audio_progress(sum(i.samples_hint for i in self.inputs), enabled=options.use_tqdm)

    # ------------------------------------------------------------------ driven by the engine's owner
    def owns(self, request_id: str) -> bool:
        return request_id in self.in_flight

    def take_finished(self) -> List[Tuple[int, TranscriptionResult]]:
        """(input index, result) of each input finished since the last call; its bookkeeping is dropped then."""
        finished = []
        while self.newly_finished:
            item = self.newly_finished.pop(0)
            finished.append((item.index, self._result(item)))
            item.done, item.windows = {}, []
        return finished

    def take_progress(self) -> List[Tuple[int, List[Segment], str]]:
        """With `stream`: (input index, segments, text) of each input's leading windows that became final since the
        last call, in time order; an input's texts joined are its result's text. Call it before take_finished."""
        progress: List[Tuple[int, List[Segment], str]] = []
        for item in self.inputs if self.stream else []:
            first, started = self._streamed.get(item.index, (0, False))
            last = first
            while item.error is None and last in item.done:
                last += 1
            if last == first:
                continue
            windows = [item.done[k] for k in range(first, last)]
            pieces, segments = pieces_and_segments(windows, self.tokens, self._decode, self.options.timestamps)
            text = "".join(pieces) if started else "".join(pieces).lstrip()
            self._streamed[item.index] = (last, started or bool(text))
            if text or segments:
                progress.append((item.index, segments, text))
        return progress

    def results(self) -> List[TranscriptionResult]:
        """Every input's result, in input order (once the job is done)."""
        return [self._result(item) for item in self.inputs]

    def abort(self) -> None:
        """Abort the job's engine requests still running."""
        if self.in_flight:
            self.engine.abort_request(list(self.in_flight))
            self.in_flight.clear()

    def close(self) -> None:
        self.progress.close()
        for item in self.inputs:
            item.close_stream()

    def on_output(self, output: Any) -> None:
        task = self.in_flight.get(output.request_id)
        if task is None or not output.finished:
            return
        del self.in_flight[output.request_id]
        task.owner.request_ids.discard(output.request_id)
        if task.owner.finished:
            return
        if output.ignored_reason:
            self._fail(task.owner, f"a request was ignored by the engine: {output.ignored_reason}")
            return
        task.on_done(output)

    def fill(self) -> None:
        """Admit queued requests up to max_in_flight, reading more windows and inputs when the queue runs dry."""
        while len(self.in_flight) < self.max_in_flight:
            task = self._next_task()
            if task is None:
                return
            if task.owner.finished:
                continue
            request_id = f"{self._prefix}{next(self._ids)}"
            try:
                self.engine.add_request(request_id, task.make_prompt(), task.params)
            except (AudioError, ValueError, TypeError) as error:
                self._fail(task.owner, str(error))
                continue
            self.in_flight[request_id] = task
            task.owner.request_ids.add(request_id)

    # ------------------------------------------------------------------ per window
    def _prompt(self, item: InputState, window: Window, previous: List[int]) -> WindowPrompt:
        return self.plan.prompt(item.language, window.index == 0, previous)

    def _window_task(self, item: InputState, window: Window, prompt: WindowPrompt, attempt: int) -> WindowTask:
        """The request decoding `window` at the attempt'th temperature."""
        temperature = self.options.temperatures[attempt]
        seed = attempt_seed(self.options.seed, item.index, window.index, attempt)
        params, probe = self.plan.params(prompt, temperature, seed)

        def make_prompt() -> dict:
            return {"prompt_token_ids": prompt.token_ids,
                    "multi_modal_data": {"input_features": self._features(window)}}

        def on_done(output: Any) -> None:
            result = self.plan.attempt(output, temperature, probe, self._decode)
            self._attempt_done(item, window, prompt, attempt, result)

        return WindowTask(item, make_prompt, params, on_done)

    def _attempt_done(self, item: InputState, window: Window, prompt: WindowPrompt, attempt: int,
                      result: Attempt) -> None:
        """Re-queue a failed attempt at the next temperature (first in line), or keep it and move on."""
        outcome = verdict(result, self.plan.limits, attempt + 1 < len(self.options.temperatures))
        if outcome is Verdict.RETRY:
            self.queue.appendleft(self._window_task(item, window, prompt, attempt + 1))
            return
        token_ids = [] if outcome is Verdict.SILENCE else prompt.forced + result.token_ids
        self._window_done(item, window, token_ids, result)
        if not self.options.condition_on_previous_text:
            self._maybe_finish(item)
            return
        item.context.extend(item.done[window.index].token_ids)  # without dropped hallucinations
        if result.temperature > self.options.prompt_reset_on_temperature:
            item.context_start = len(item.context)  # openai-whisper: no prompt after a high-temperature window
        self._queue_next_sequential(item)

    def _features(self, window: Window) -> torch.Tensor:
        return features_for(self.engine, window.samples)

    def _window_done(self, item: InputState, window: Window, token_ids: List[int],
                     result: Optional[Attempt] = None) -> None:
        scores = {} if result is None else dict(temperature=result.temperature, avg_logprob=result.avg_logprob,
                                                compression_ratio=result.compression_ratio,
                                                no_speech_prob=result.no_speech_prob)
        done = WindowTokens(window.offset, window.duration, token_ids, window.time_map, **scores)
        if self.aligner is not None:  # word timings: an alignment pass over the kept tokens, before the release
            words = self.aligner.window_words(self._features(window), token_ids, item.language,
                                              self.options.task, window.duration) if token_ids else []
            done = self._without_hallucinations(done, words)
        item.done[window.index] = done
        window.release()  # the audio is no longer needed
        item.samples_progressed += window.num_samples
        self.progress.update(window.num_samples)

    def _without_hallucinations(self, done: WindowTokens, words: List[List[WordTiming]]) -> WindowTokens:
        """The window with its words (word_timestamps) and without the segments hallucination_silence_threshold
        drops (hallucination.py)."""
        threshold = self.options.hallucination_silence_threshold
        dropped = set()
        if threshold is not None:
            dropped = hallucinated_segments(words, done.input_span, done.duration, threshold)
        token_ids = drop_segments(done.token_ids, self.tokens.is_timestamp, self.tokens.is_text, dropped)
        kept_words = [segment for index, segment in enumerate(words) if index not in dropped]
        return dataclasses.replace(done, token_ids=token_ids,
                                   words=kept_words if self.options.word_timestamps else None)

    # ------------------------------------------------------------------ per input
    def _maybe_finish(self, item: InputState) -> None:
        if not item.finished and item.all_read and len(item.done) == len(item.windows):
            item.finished = True
            self.newly_finished.append(item)

    def _fail(self, item: InputState, message: str) -> None:
        if item.finished:
            return
        item.error = message
        item.finished = True
        if item.request_ids:
            self.engine.abort_request(list(item.request_ids))
            for request_id in item.request_ids:
                self.in_flight.pop(request_id, None)
            item.request_ids.clear()
        self.progress.update(max(0, item.samples_counted - item.samples_progressed))
        item.drop_audio()
        if item in self.producers:
            self.producers.remove(item)
        self.newly_finished.append(item)
        logger.debug("transcription of %s failed: %s", item.name, message)

    def _result(self, item: InputState) -> TranscriptionResult:
        if item.error is not None:
            return TranscriptionResult("", item.language, [], item.error, item.duration, item.language_probability,
                                       item.name)
        windows = [item.done[k] for k in sorted(item.done)]
        text, segments = stitch(windows, self.tokens, self._decode, self.options.timestamps)
        return TranscriptionResult(text, item.language, segments, None, item.duration, item.language_probability,
                                   item.name)

    def _decode(self, token_ids: List[int]) -> str:
        return self.engine.tokenizer.decode(token_ids, skip_special_tokens=True) if token_ids else ""
