"""Batch transcription: every 30 s window of every input through the engine as one continuous batch.

    results = transcribe(llm, ["a.wav", "b.flac", (samples, 44100)], timestamps=True)
    results[0].text, results[0].segments, results[0].error

How it runs (the engine is driven directly with add_request/step, so progress can be reported per window):

* Inputs are loaded lazily, in order, as the engine has room (`max_in_flight` requests at a time), split into
  30 s windows (the encoder's span; with vad_filter, speech regions packed into windows, vad_windows.py), each
  one request whose log-mel features are computed at admission. An unreadable input (AudioError) gets `.error`.
* Language: given, or detected per input on its first (non-silent) window with a 1-token request (see
  language.py); the input's windows are queued when its detection finishes. English-only models use "en".
* Throughput mode (default): all windows of all inputs are independent requests. Sequential mode
  (`condition_on_previous_text=True`): an input's window k+1 is queued when window k finishes, with
  `<|startofprev|>` + the previous windows' last tokens before its prompt; different inputs still run together.
* Each request applies Whisper's suppress / begin-suppress / timestamp rules as logits processors (processors.py)
  and decodes greedily (or with beam search, `beam_width` > 1: BeamSearchParams with the same processors, which
  then act on log-prob rows as in HF), so a window's tokens equal transformers' `generate(num_beams=...)` on it.
* Results are stitched per input (segments.py): timestamps shifted by each window's offset, texts joined.
  The per-input and per-window bookkeeping and the model facts (tokens, window length, features) are in
  work_items.py.
"""
from __future__ import annotations

import collections
import itertools
import logging
import uuid
from typing import Any, Deque, Dict, Iterator, List, Optional, Sequence, Union

import torch
from tqdm.auto import tqdm

from seq2seq_engine.audio import SAMPLE_RATE, AudioError, encoder_window_samples, load_audio
from seq2seq_engine.beam_search_params import BeamSearchParams
from seq2seq_engine.sampling_params import SamplingParams
from seq2seq_engine.transcription.language import detection_params, detection_prompt, parse_detection
from seq2seq_engine.transcription.processors import whisper_processors
from seq2seq_engine.transcription.prompts import TASKS
from seq2seq_engine.transcription.results import TranscriptionResult
from seq2seq_engine.transcription.segments import WindowTokens, stitch
from seq2seq_engine.transcription.vad_windows import window_vad_options
from seq2seq_engine.transcription.word_timestamps import WordAligner
from seq2seq_engine.transcription.work_items import (InputState, Window, WindowTask, describe_source, features_for,
                                                     is_single_input, make_windows, samples_hint,
                                                     whisper_tokens_for)

logger = logging.getLogger(__name__)

_REQUEST_PREFIX = "transcribe"


# ---------------------------------------------------------------------------------------------- the pipeline
class _Transcription:
    def __init__(self, engine: Any, sources: Sequence[Any], language: Optional[str], task: str, timestamps: bool,
                 condition_on_previous_text: bool, max_new_tokens: Optional[int], use_tqdm: bool,
                 max_in_flight: Optional[int], skip_silence: bool, beam_width: int, vad_filter: bool = False,
                 vad_parameters: Any = None, word_timestamps: bool = False) -> None:
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
        self.window_samples = encoder_window_samples(engine.model_config.max_encoder_len)
        self.vad = window_vad_options(vad_filter, vad_parameters, self.window_samples)
        self.processors = whisper_processors(self.tokens, timestamps)
        self.aligner = WordAligner(engine, self.tokens) if word_timestamps else None
        self.max_in_flight = engine.scheduler_config.max_num_seqs if max_in_flight is None else max_in_flight
        if not isinstance(self.max_in_flight, int) or self.max_in_flight < 1:
            raise ValueError(f"max_in_flight must be >= 1, got {max_in_flight}")
        self.inputs = [InputState(i, source, describe_source(source, i), samples_hint(source))
                       for i, source in enumerate(sources)]
        self._pending_inputs: Iterator[InputState] = iter(self.inputs)
        self.queue: Deque[WindowTask] = collections.deque()
        self.in_flight: Dict[str, WindowTask] = {}
        self._ids = itertools.count()
        self._prefix = f"{_REQUEST_PREFIX}-{uuid.uuid4().hex[:8]}-"
        # Counted in samples (exact integers), shown in seconds.
        self.progress = tqdm(total=sum(i.samples_hint for i in self.inputs), unit="s", unit_scale=1 / SAMPLE_RATE,
                             desc="Transcribed audio", disable=not use_tqdm,
                             bar_format="{l_bar}{bar}| {n:.1f}/{total:.1f} s [{elapsed}<{remaining}]")

    # ------------------------------------------------------------------ the loop
    def run(self) -> List[TranscriptionResult]:
        try:
            while True:
                self._fill()
                if not self.in_flight:
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
        except BaseException:
            if self.in_flight:
                self.engine.abort_request(list(self.in_flight))
            raise
        finally:
            self.progress.close()
        return [self._result(item) for item in self.inputs]

    def _fill(self) -> None:
        """Admit queued requests up to max_in_flight, loading more inputs when the queue runs dry."""
        while len(self.in_flight) < self.max_in_flight:
            if not self.queue:
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
        try:
            audio = load_audio(item.source)
        except (AudioError, ValueError, TypeError) as error:  # this input is unusable; the others go on
            self._fail(item, str(error))
            return
        item.duration = len(audio) / SAMPLE_RATE
        self._adjust_total(len(audio) - item.samples_hint)
        item.windows = make_windows(audio, self.window_samples, self.skip_silence, self.vad)
        self.progress.update(len(audio) - sum(len(w.samples) for w in item.windows))  # what VAD left out is done
        item.language = self.language
        speech = [w for w in item.windows if not w.silent]
        if item.language is None and speech:
            first = speech[0]
            self.queue.append(WindowTask(item, lambda: detection_prompt(self.tokens, self._features(first)),
                                         detection_params(self.tokens), lambda out: self._detected(item, out)))
            return
        self._queue_windows(item)

    def _detected(self, item: InputState, output: Any) -> None:
        try:
            item.language, item.language_probability = parse_detection(output, self.tokens)
        except ValueError as error:
            self._fail(item, str(error))
            return
        self._queue_windows(item)

    def _queue_windows(self, item: InputState) -> None:
        """Queue the input's windows (all of them, or the first in sequential mode); silent ones finish at once."""
        if self.sequential:
            self._queue_next_sequential(item)
            return
        for window in item.windows:
            if window.silent:
                self._window_done(item, window, [])
            else:
                self.queue.append(self._window_task(item, window, previous=None))
        self._maybe_finish(item)

    def _queue_next_sequential(self, item: InputState) -> None:
        while not item.finished:
            k = len(item.done)
            if k == len(item.windows):
                self._maybe_finish(item)
                return
            window = item.windows[k]
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
                                         "multi_modal_data": {"input_features": self._features(window)}},
                          params, on_done)

    def _features(self, window: Window) -> torch.Tensor:
        return features_for(self.engine, window.samples)

    def _window_done(self, item: InputState, window: Window, token_ids: List[int]) -> None:
        done = item.done[window.index] = WindowTokens(window.offset, window.duration, token_ids, window.time_map)
        if self.aligner is not None:  # word timestamps: an alignment pass over the finished window
            done.words = self.aligner.window_words(self._features(window), token_ids, item.language, self.task,
                                                   window.duration)
        self.progress.update(len(window.samples))

    def _maybe_finish(self, item: InputState) -> None:
        if not item.finished and len(item.done) == len(item.windows):
            item.finished = True
            item.windows = []  # the audio is no longer needed

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
        remaining = sum(len(w.samples) for w in item.windows if w.index not in item.done)
        self.progress.update(remaining if item.windows else item.samples_hint)
        item.windows = []
        logger.debug("transcription of %s failed: %s", item.name, message)

    def _adjust_total(self, delta: int) -> None:
        if delta and not self.progress.disable:
            self.progress.total += delta
            self.progress.refresh()

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
               skip_silence: bool = True, beam_width: int = 1, vad_filter: bool = False,
               vad_parameters: Any = None, word_timestamps: bool = False) -> List[TranscriptionResult]:
    """Transcribe (or translate to English) each input with a Whisper model; one result per input, in order.

    llm: an `LLM` (or its `LLMEngine`) running a Whisper model with its tokenizer.
    audio: one input or a list; an input is a file path, raw file bytes, a 16 kHz mono array, or an
        (array, sample_rate) tuple. Inputs that cannot be read give results with `.error` set.
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
        loaded and features computed only as requests are admitted.
    skip_silence: windows whose level is below -60 dBFS are not decoded (no text), instead of letting
        Whisper hallucinate on silence.
    beam_width: 1 decodes greedily; more runs HF-style beam search per window (length_penalty 1, no early
        stopping, as `generate(num_beams=beam_width)`), the best hypothesis giving the text. Language
        detection stays a greedy 1-token request.
    vad_filter: decode only speech (Silero VAD): each input's speech regions, padded, are packed into 30 s windows
        and timestamps mapped back to the input's timeline; non-speech gives no text (vad_windows.py).
    vad_parameters: a dict or VadOptions (seq2seq_engine.audio.vad; faster-whisper's fields and defaults, with
        max_speech_duration_s capped at the 30 s window); validated, and used only with vad_filter.
    word_timestamps: each segment gets `.words` (Word: start, end, word, probability; word_timestamps.py).
    """
    engine = getattr(llm, "llm_engine", llm)
    sources = [audio] if is_single_input(audio) else list(audio)
    return _Transcription(engine, sources, language, task, timestamps, condition_on_previous_text, max_new_tokens,
                          use_tqdm, max_in_flight, skip_silence, beam_width, vad_filter, vad_parameters,
                          word_timestamps).run()
