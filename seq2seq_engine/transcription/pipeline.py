"""Batch transcription: every 30 s window of every input through the engine as one continuous batch.

    results = transcribe(llm, ["a.wav", "b.flac", (samples, 44100)], timestamps=True)
    results[0].text, results[0].segments, results[0].error

How it runs (the engine is driven directly with add_request/step, so progress can be reported per window):

* Inputs are read lazily, in order, as the engine has room (`max_in_flight` requests at a time): each is a stream
  of 30 s windows (the encoder's span; audio/stream.py decodes only as far as the windows taken need) and each
  window becomes one request whose log-mel features are computed at admission; a window's samples are dropped once
  it is decoded, so memory holds the windows in flight, not whole inputs. An input that cannot be read
  (AudioError, also when found part way through) gets a result with `.error` set; the others go on.
* Language: given, or detected per input on its first (non-silent) window with a 1-token request (see
  language.py); the input's windows are queued when its detection finishes. English-only models use "en".
* Throughput mode (default): all windows of all inputs are independent requests. Sequential mode
  (`condition_on_previous_text=True`): an input's window k+1 is queued when window k finishes, with
  `<|startofprev|>` + the previous windows' last tokens before its prompt; different inputs still run together.
* Each request applies Whisper's suppress / begin-suppress / timestamp rules as logits processors (processors.py)
  and decodes greedily (or with beam search, `beam_width` > 1: BeamSearchParams with the same processors, which
  then act on log-prob rows as in HF), so a window's tokens equal transformers' `generate(num_beams=...)` on it.
* Results are stitched per input (segments.py): timestamps shifted by each window's offset, texts joined.
  `iter_transcribe` yields each input's result as soon as it finishes; `transcribe` returns them all in order.
  The per-input and per-window bookkeeping and the model facts (tokens, window length, features) are in
  work_items.py.
"""
from __future__ import annotations

import collections
import itertools
import logging
import uuid
from typing import Any, Deque, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import torch

from seq2seq_engine.audio import AudioError
from seq2seq_engine.audio.stream import iter_windows
from seq2seq_engine.beam_search_params import BeamSearchParams
from seq2seq_engine.sampling_params import SamplingParams
from seq2seq_engine.transcription.language import detection_params, detection_prompt, parse_detection
from seq2seq_engine.transcription.processors import whisper_processors
from seq2seq_engine.transcription.progress import audio_progress
from seq2seq_engine.transcription.prompts import TASKS
from seq2seq_engine.transcription.results import TranscriptionResult
from seq2seq_engine.transcription.segments import WindowTokens, stitch
from seq2seq_engine.transcription.work_items import (InputState, Window, WindowTask, describe_source, features_for,
                                                     is_single_input, samples_hint, whisper_tokens_for, window_samples)

logger = logging.getLogger(__name__)

_REQUEST_PREFIX = "transcribe"


# ---------------------------------------------------------------------------------------------- the pipeline
class _Transcription:
    def __init__(self, engine: Any, sources: Sequence[Any], language: Optional[str], task: str, timestamps: bool,
                 condition_on_previous_text: bool, max_new_tokens: Optional[int], use_tqdm: bool,
                 max_in_flight: Optional[int], skip_silence: bool, beam_width: int) -> None:
        if task not in TASKS:
            raise ValueError(f"task must be one of {TASKS}, got {task!r}")
        max_beam_width = engine.scheduler_config.max_beam_width
        if not isinstance(beam_width, int) or isinstance(beam_width, bool) or not 1 <= beam_width <= max_beam_width:
            raise ValueError(f"beam_width must be an int from 1 to the engine's max_beam_width ({max_beam_width}), "
                             f"got {beam_width!r}")
        if max_new_tokens is not None and (not isinstance(max_new_tokens, int) or max_new_tokens < 1):
            raise ValueError(f"max_new_tokens must be a positive int or None, got {max_new_tokens!r}")
        self.engine = engine
        self.tokens = whisper_tokens_for(engine)
        self.language = self.tokens.language_code(language) if language is not None else None
        if not self.tokens.is_multilingual:
            self.language = "en"
        self.tokens.prompt(self.language or next(iter(self.tokens.language_ids), None), task, timestamps)  # validate
        self.task = task
        self.timestamps = timestamps
        self.sequential = condition_on_previous_text
        self.max_new_tokens = max_new_tokens
        self.skip_silence = skip_silence
        self.beam_width = beam_width
        self.window_samples = window_samples(engine)
        self.processors = whisper_processors(self.tokens, timestamps)
        self.max_in_flight = engine.scheduler_config.max_num_seqs if max_in_flight is None else max_in_flight
        if not isinstance(self.max_in_flight, int) or self.max_in_flight < 1:
            raise ValueError(f"max_in_flight must be >= 1, got {max_in_flight}")
        self.inputs = [InputState(i, source, describe_source(source, i), samples_hint(source))
                       for i, source in enumerate(sources)]
        self._pending_inputs: Iterator[InputState] = iter(self.inputs)
        self.queue: Deque[WindowTask] = collections.deque()
        self.in_flight: Dict[str, WindowTask] = {}
        self.producers: List[InputState] = []  # inputs whose next windows are read as the queue runs dry
        self.newly_finished: List[InputState] = []
        self._ids = itertools.count()
        self._prefix = f"{_REQUEST_PREFIX}-{uuid.uuid4().hex[:8]}-"
        self.progress = audio_progress(sum(i.samples_hint for i in self.inputs), enabled=use_tqdm)

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
                    task = self.in_flight.get(output.request_id)
                    if task is None or not output.finished:
                        continue
                    del self.in_flight[output.request_id]
                    task.owner.request_ids.discard(output.request_id)
                    if task.owner.finished:
                        continue
                    if output.ignored_reason:
                        self._fail(task.owner, f"a request was ignored by the engine: {output.ignored_reason}")
                        continue
                    task.on_done(output)
                yield
        except BaseException:
            if self.in_flight:
                self.engine.abort_request(list(self.in_flight))
            raise
        finally:
            self.progress.close()
            for item in self.inputs:
                item.close_stream()

    def _fill(self) -> None:
        """Admit queued requests up to max_in_flight, loading more inputs when the queue runs dry."""
        while len(self.in_flight) < self.max_in_flight:
            if not self.queue:
                if self.producers:
                    self._produce(self.producers[0])
                    continue
                item = next(self._pending_inputs, None)
                if item is None:
                    return
                self._start(item)
                continue
            task = self.queue.popleft()
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

    # ------------------------------------------------------------------ per input
    def _start(self, item: InputState) -> None:
        item.stream = iter_windows(item.source, self.window_samples)  # opened on the first read
        item.language = self.language
        if item.language is None:
            first = self._first_speech_window(item)
            if item.finished:
                return
            if first is not None:
                self.queue.append(WindowTask(item, lambda: detection_prompt(self.tokens, self._features(first)),
                                             detection_params(self.tokens), lambda out: self._detected(item, out)))
                return
        self._queue_windows(item)

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
            window = item.next_window(self.skip_silence)
        except (AudioError, ValueError, TypeError) as error:  # this input is unusable; the others go on
            self._fail(item, str(error))
            return None
        self.progress.add_total(item.recount())
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
            self.queue.append(self._window_task(item, window, previous=None))

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
        if self.sequential:
            self._queue_next_sequential(item)
            return
        for window in item.windows:
            if window.index not in item.done:
                self.queue.append(self._window_task(item, window, previous=None))
        self.producers.append(item)
        self.producers.sort(key=lambda producer: producer.index)  # earlier inputs first: they finish sooner

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
            previous = [t for index in range(k) for t in item.done[index].token_ids]
            self.queue.append(self._window_task(item, window, previous=previous))
            return

    def _window_task(self, item: InputState, window: Window, previous: Optional[List[int]]) -> WindowTask:
        prompt = self.tokens.prompt(item.language, self.task, self.timestamps, previous_tokens=previous)
        max_tokens = self.tokens.max_new_tokens(len(prompt), self.max_new_tokens)
        params: Union[SamplingParams, BeamSearchParams] = (
            BeamSearchParams(beam_width=self.beam_width, max_tokens=max_tokens, logits_processors=self.processors)
            if self.beam_width > 1 else
            SamplingParams(temperature=0.0, max_tokens=max_tokens, logits_processors=self.processors))

        def on_done(output: Any) -> None:
            token_ids = list(output.outputs[0].token_ids)
            if token_ids and token_ids[-1] == self.tokens.eot:
                token_ids.pop()
            self._window_done(item, window, token_ids)
            if self.sequential:
                self._queue_next_sequential(item)
            else:
                self._maybe_finish(item)

        return WindowTask(item, lambda: {"prompt_token_ids": prompt,
                                         "multi_modal_data": {"input_features": self._features(window)}}, params,
                          on_done)

    def _features(self, window: Window) -> torch.Tensor:
        return features_for(self.engine, window.samples)

    def _window_done(self, item: InputState, window: Window, token_ids: List[int]) -> None:
        item.done[window.index] = WindowTokens(window.offset, window.duration, token_ids)
        window.release()  # the audio is no longer needed
        item.samples_progressed += window.num_samples
        self.progress.update(window.num_samples)

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
        text, segments = stitch(windows, self.tokens, self._decode, self.timestamps)
        return TranscriptionResult(text, item.language, segments, None, item.duration, item.language_probability,
                                   item.name)

    def _decode(self, token_ids: List[int]) -> str:
        return self.engine.tokenizer.decode(token_ids, skip_special_tokens=True) if token_ids else ""


def transcribe(llm: Any, audio: Any, *, language: Optional[str] = None, task: str = "transcribe",
               timestamps: bool = False, condition_on_previous_text: bool = False,
               max_new_tokens: Optional[int] = None, use_tqdm: bool = True, max_in_flight: Optional[int] = None,
               skip_silence: bool = True, beam_width: int = 1) -> List[TranscriptionResult]:
    """Transcribe (or translate to English) each input with a Whisper model; one result per input, in order.

    llm: an `LLM` (or its `LLMEngine`) running a Whisper model with its tokenizer.
    audio: one input or a list; an input is a file path, raw file bytes, a 16 kHz mono array, or an
        (array, sample_rate) tuple. Files are any audio FFmpeg decodes (wav, flac, mp3, m4a/aac, ogg/opus,
        webm, the audio track of mp4/mkv video, ...), read 30 s at a time as decoding proceeds. Inputs that
        cannot be read give results with `.error` set.
    language: a code or name ("en", "German", "<|de|>"); None detects it per input on its first 30 s
        (multilingual models; English-only models always use "en").
    task: "transcribe" or "translate" (to English; multilingual models only).
    timestamps: predict timestamp tokens: one segment per timestamp pair, times in seconds from the input's
        start; without, one segment per 30 s window.
    condition_on_previous_text: decode an input's windows one after the other, each prompted with the previous
        windows' last tokens after <|startofprev|> (inputs still run together); default: all windows at once.
    max_new_tokens: per window; default 224 (openai-whisper's n_text_ctx // 2), always capped so prompt + new
        tokens fit the decoder's max_target_positions.
    use_tqdm: a progress bar over seconds of audio, advanced as windows finish.
    max_in_flight: most requests in the engine at once (default: the engine's max_num_seqs); inputs are
        decoded and features computed only as requests are admitted.
    skip_silence: windows whose level is below -60 dBFS are not decoded (no text), instead of letting
        Whisper hallucinate on silence.
    beam_width: 1 decodes greedily; more runs HF-style beam search per window (length_penalty 1, no early
        stopping, as `generate(num_beams=beam_width)`), the best hypothesis giving the text. Language
        detection stays a greedy 1-token request.
    """
    return _transcription(llm, audio, language, task, timestamps, condition_on_previous_text, max_new_tokens,
                          use_tqdm, max_in_flight, skip_silence, beam_width).run()


def iter_transcribe(llm: Any, audio: Any, *, language: Optional[str] = None, task: str = "transcribe",
                    timestamps: bool = False, condition_on_previous_text: bool = False,
                    max_new_tokens: Optional[int] = None, use_tqdm: bool = True, max_in_flight: Optional[int] = None,
                    skip_silence: bool = True, beam_width: int = 1) -> Iterator[Tuple[int, TranscriptionResult]]:
    """As `transcribe`, but yields `(input index, result)` for each input as soon as it finishes (in the order they
    finish), so a caller can write each result out while the others run. Stopping the iteration early aborts the
    engine requests still running. Arguments are checked when it is called, before the first result."""
    return _transcription(llm, audio, language, task, timestamps, condition_on_previous_text, max_new_tokens,
                          use_tqdm, max_in_flight, skip_silence, beam_width).iter_results()


def _transcription(llm: Any, audio: Any, *args: Any) -> _Transcription:
    engine = getattr(llm, "llm_engine", llm)
    sources = [audio] if is_single_input(audio) else list(audio)
    return _Transcription(engine, sources, *args)
