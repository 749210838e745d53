"""Batch transcription: every window of every input through the engine as one continuous batch.

    results = transcribe(llm, ["a.wav", "b.mp3", (samples, 44100)], timestamps=True)
    for index, result in iter_transcribe(llm, paths, vad_filter=True): ...

How it runs (the engine is driven directly with add_request/step, so progress is reported per window):

* Inputs are read lazily, in order, as the engine has room (`max_in_flight` requests at a time, by default as many
  as keep their KV cache within a budget: in_flight.py; input_queue.py).
  Each input is a stream of 30 s windows (the encoder's span; only the `clip_timestamps` spans when given) decoded
  only as far as the windows taken need, or with `vad_filter` its speech regions packed into windows
  (window_source.py, vad_windows.py). A window's samples are dropped once it is final, so memory holds the windows
  in flight. An input that cannot be read (AudioError, also part way through) gets a result with `.error` set.
* Language: given, or detected per input on its first window with speech with a 1-token request (language.py).
  English-only models use "en".
* Throughput mode (default): all windows of all inputs are independent requests. Sequential mode
  (`condition_on_previous_text=True`): an input's window k+1 is queued when window k is final, with
  `<|startofprev|>` + the text kept so far before its prompt; different inputs still run together.
* Each attempt decodes at one temperature (decode_params.py): greedy (or beam search) at 0, `best_of` seeded samples
  above, with Whisper's suppress / begin-suppress / timestamp rules as logits processors and a hook that reads
  P(<|nospeech|>) at the `<|startoftranscript|>` position. fallback.py judges the finished attempt: a failed one is
  queued again at the next temperature, ahead of the queue, while the batch's other windows keep decoding; a silent
  one keeps no text.
* Results are stitched per input (segments.py): timestamps shifted by each window's offset (or mapped through a
  packed window's TimeMap), texts joined, each segment carrying its window's temperature, avg_logprob,
  compression_ratio and no_speech_prob. `iter_transcribe` yields each input's result as soon as it finishes;
  `transcribe` returns them all in input order.
* Word timestamps (`word_timestamps=True`, word_timestamps.py): once a window's kept attempt is known, and before
  its samples are released, one alignment pass (the window's text tokens through the decoder with the alignment
  heads' cross-attention kept) times its words; they are mapped to the input like the segments.
"""
from __future__ import annotations

import itertools
import logging
import uuid
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import torch

from seq2seq_engine.audio import AudioError, encoder_window_samples
from seq2seq_engine.transcription.decode_params import DecodePlan, WindowPrompt, attempt_seed
from seq2seq_engine.transcription.fallback import Attempt, Verdict, verdict
from seq2seq_engine.transcription.in_flight import default_windows_in_flight
from seq2seq_engine.transcription.input_queue import InputQueue
from seq2seq_engine.transcription.options import TranscriptionOptions, resolve_options
from seq2seq_engine.transcription.progress import audio_progress
from seq2seq_engine.transcription.results import TranscriptionResult
from seq2seq_engine.transcription.segments import WindowTokens, stitch
from seq2seq_engine.transcription.vad_windows import window_vad_options
from seq2seq_engine.transcription.word_timestamps import WordAligner
from seq2seq_engine.transcription.work_items import (InputState, Window, WindowTask, features_for, is_single_input,
                                                     whisper_tokens_for)

logger = logging.getLogger(__name__)

_REQUEST_PREFIX = "transcribe"


class _Transcription(InputQueue):
    """One transcribe call: the engine loop and each window's attempts (input reading and queueing: InputQueue)."""

    def __init__(self, engine: Any, sources: Sequence[Any], options: TranscriptionOptions) -> None:
        self.engine, self.options = engine, options
        self.tokens = whisper_tokens_for(engine)
        self.language = self.tokens.language_code(options.language) if options.language is not None else None
        if not self.tokens.is_multilingual:
            self.language = "en"
        self.tokens.prompt(self.language or next(iter(self.tokens.language_ids), None), options.task,
                           options.timestamps)  # validates the task for this model
        self.plan = DecodePlan(engine, self.tokens, options)
        self.aligner = WordAligner(engine, self.tokens) if options.word_timestamps else None
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

    # ------------------------------------------------------------------ the loop
    def run(self) -> List[TranscriptionResult]:
        for _ in self._steps():
            self.newly_finished.clear()
        return [self._result(item) for item in self.inputs]

    def iter_results(self) -> Iterator[Tuple[int, TranscriptionResult]]:
        """(input index, result) for each input as soon as it finishes; its bookkeeping is dropped then."""
        for _ in self._steps():
            while self.newly_finished:
                item = self.newly_finished.pop(0)
                result = self._result(item)
                item.done, item.windows = {}, []
                yield item.index, result

    def _steps(self) -> Iterator[None]:
        """Drive the engine, pausing after each step (and at the end) for the inputs finished meanwhile."""
        try:
            while True:
                self._fill()
                if not self.in_flight:
                    yield
                    break
                for output in self.engine.step():
                    self._on_output(output)
                yield
        except BaseException:
            if self.in_flight:
                self.engine.abort_request(list(self.in_flight))
            raise
        finally:
            self.progress.close()
            for item in self.inputs:
                item.close_stream()

    def _on_output(self, output: Any) -> None:
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

    def _fill(self) -> None:
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
        item.context.extend(token_ids)
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
        done = item.done[window.index] = WindowTokens(window.offset, window.duration, token_ids, window.time_map,
                                                      **scores)
        if self.aligner is not None:  # word timestamps: an alignment pass over the kept tokens, before the release
            done.words = self.aligner.window_words(self._features(window), token_ids, item.language,
                                                   self.options.task, window.duration) if token_ids else []
        window.release()  # the audio is no longer needed
        item.samples_progressed += window.num_samples
        self.progress.update(window.num_samples)

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


def transcribe(llm: Any, audio: Any, options: Optional[TranscriptionOptions] = None,
               **overrides: Any) -> List[TranscriptionResult]:
    """Transcribe (or translate to English) each input with a Whisper model; one result per input, in order.

        results = transcribe(llm, ["a.wav", "b.mp3", (samples, 44100)], timestamps=True)
        results = transcribe(llm, audio, TranscriptionOptions(temperature=0.0, beam_width=5), language="de")
        results[0].text, results[0].segments, results[0].error

    llm: an `LLM` (or its `LLMEngine`) running a Whisper model with its tokenizer.
    audio: one input or a list; an input is a file path, raw file bytes, a 16 kHz mono array, or an
        (array, sample_rate) tuple. Files are any audio FFmpeg decodes (wav, flac, mp3, m4a/aac, ogg/opus, webm,
        the audio track of mp4/mkv video, ...), read 30 s at a time as decoding proceeds (whole, with vad_filter).
        Inputs that cannot be read give results with `.error` set.
    options: a TranscriptionOptions (default: its defaults); keyword overrides replace its fields, e.g.
        `transcribe(llm, files, language="de", timestamps=True, temperature=0.0, vad_filter=True)`. See
        TranscriptionOptions for every field; the defaults follow openai-whisper (temperature fallback 0.0 to 1.0,
        thresholds 2.4 / -1.0 / 0.6). `temperature=0.0` alone decodes each window once, greedily (or with beam
        search, beam_width > 1), as transformers' `generate` does.
    """
    return _transcription(llm, audio, options, overrides).run()


def iter_transcribe(llm: Any, audio: Any, options: Optional[TranscriptionOptions] = None,
                    **overrides: Any) -> Iterator[Tuple[int, TranscriptionResult]]:
    """As `transcribe` (same options), but yields `(input index, result)` for each input as soon as it finishes (in
    the order they finish), so a caller can write each result out while the others run. Stopping the iteration early
    aborts the engine requests still running. Options are checked when it is called, before the first result."""
    return _transcription(llm, audio, options, overrides).iter_results()


def _transcription(llm: Any, audio: Any, options: Optional[TranscriptionOptions],
                   overrides: Dict[str, Any]) -> _Transcription:
    options = resolve_options(options, overrides)
    engine = getattr(llm, "llm_engine", llm)
    sources = [audio] if is_single_input(audio) else list(audio)
    return _Transcription(engine, sources, options)
