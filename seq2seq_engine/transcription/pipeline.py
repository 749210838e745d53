"""Batch transcription: every 30 s window of every input through the engine as one continuous batch."""
from __future__ import annotations

import collections
import itertools
import logging
import uuid
from typing import Any, Deque, Dict, Iterator, List, Optional, Sequence

import torch
from tqdm.auto import tqdm

from seq2seq_engine.audio import SAMPLE_RATE, AudioError, encoder_window_samples, load_audio
from seq2seq_engine.transcription.decode_params import DecodePlan, WindowPrompt, attempt_seed
from seq2seq_engine.transcription.fallback import Attempt, Verdict, verdict
from seq2seq_engine.transcription.language import detection_params, detection_prompt, parse_detection
from seq2seq_engine.transcription.options import TranscriptionOptions, resolve_options
from seq2seq_engine.transcription.results import TranscriptionResult
from seq2seq_engine.transcription.segments import WindowTokens, stitch
from seq2seq_engine.transcription.vad_windows import window_vad_options
from seq2seq_engine.transcription.work_items import (InputState, Window, WindowTask, describe_source, features_for,
                                                     is_single_input, make_windows, samples_hint, whisper_tokens_for)

logger = logging.getLogger(__name__)

_REQUEST_PREFIX = "transcribe"


# ---------------------------------------------------------------------------------------------- the pipeline
class _Transcription:
    """One transcribe call. The engine is driven directly with add_request/step, so progress is reported per window:

    * Inputs are loaded lazily, in order, as the engine has room (`max_in_flight` requests at a time), split into
      30 s windows (the encoder's span; only the `clip_timestamps` spans when given; with vad_filter, the speech
      regions packed into windows, vad_windows.py) and each window becomes a request whose log-mel features are
      computed at admission. An input that cannot be read (AudioError) gets a result with
      `.error` set; the others go on.
    * Language: given, or detected per input on its first (non-silent) window with a 1-token request (see
      language.py); the input's windows are queued when its detection finishes. English-only models use "en".
    * Throughput mode (default): all windows of all inputs are independent requests. Sequential mode
      (`condition_on_previous_text=True`): an input's window k+1 is queued when window k is final, with
      `<|startofprev|>` + the text kept so far before its prompt; different inputs still run together.
    * Each attempt decodes at one temperature (decode_params.py): greedy (or beam search) at 0, `best_of` seeded
      samples above, with Whisper's suppress / begin-suppress / timestamp rules as logits processors and a hook that
      reads P(<|nospeech|>) at the `<|startoftranscript|>` position. fallback.py judges the finished attempt: a failed
      one is queued again at the next temperature, ahead of the queue, while the batch's other windows keep decoding;
      a silent one keeps no text.
    * Results are stitched per input (segments.py): timestamps shifted by each window's offset, texts joined, each
      segment carrying its window's temperature, avg_logprob, compression_ratio and no_speech_prob. The per-input and
      per-window bookkeeping and the model facts are in work_items.py.
    """

    def __init__(self, engine: Any, sources: Sequence[Any], options: TranscriptionOptions) -> None:
        self.engine, self.options = engine, options
        self.tokens = whisper_tokens_for(engine)
        self.language = self.tokens.language_code(options.language) if options.language is not None else None
        if not self.tokens.is_multilingual:
            self.language = "en"
        self.tokens.prompt(self.language or next(iter(self.tokens.language_ids), None), options.task,
                           options.timestamps)  # validates the task for this model
        self.plan = DecodePlan(engine, self.tokens, options)
        self.sequential = options.condition_on_previous_text
        self.window_samples = encoder_window_samples(engine.model_config.max_encoder_len)
        self.vad = window_vad_options(options.vad_filter, options.vad_parameters, self.window_samples)
        self.max_in_flight = options.max_in_flight or engine.scheduler_config.max_num_seqs
        self.inputs = [InputState(i, source, describe_source(source, i), samples_hint(source))
                       for i, source in enumerate(sources)]
        self._pending_inputs: Iterator[InputState] = iter(self.inputs)
        self.queue: Deque[WindowTask] = collections.deque()
        self.in_flight: Dict[str, WindowTask] = {}
        self._ids = itertools.count()
        self._prefix = f"{_REQUEST_PREFIX}-{uuid.uuid4().hex[:8]}-"
        # Counted in samples (exact integers), shown in seconds.
        self.progress = tqdm(total=sum(i.samples_hint for i in self.inputs), unit="s", unit_scale=1 / SAMPLE_RATE,
                             desc="Transcribed audio", disable=not options.use_tqdm,
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
        item.windows = make_windows(audio, self.window_samples, self.options.skip_silence, self.vad,
                                    self.options.clip_timestamps)
        self.progress.update(len(audio) - sum(len(w.samples) for w in item.windows))  # what no window covers is done
        item.language = self.language
        item.context = list(self.plan.initial_tokens)
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
                previous = self.plan.initial_tokens if window.index == 0 else []
                self.queue.append(self._window_task(item, window, self._prompt(item, window, previous), 0))
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
            prompt = self._prompt(item, window, item.context[item.context_start:])
            self.queue.append(self._window_task(item, window, prompt, 0))
            return

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
        if not self.sequential:
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
        item.done[window.index] = WindowTokens(window.offset, window.duration, token_ids, window.time_map, **scores)
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
        text, segments = stitch(windows, self.tokens, self._decode, self.options.timestamps)
        return TranscriptionResult(text, item.language, segments, None, item.duration, item.language_probability,
                                   item.name)

    def _decode(self, token_ids: List[int]) -> str:
        return self.engine.tokenizer.decode(token_ids, skip_special_tokens=True) if token_ids else ""


def transcribe(llm: Any, audio: Any, options: Optional[TranscriptionOptions] = None,
               **overrides: Any) -> List[TranscriptionResult]:
    """Transcribe (or translate to English) each input with a Whisper model; one result per input, in order.

        results = transcribe(llm, ["a.wav", "b.flac", (samples, 44100)], timestamps=True)
        results = transcribe(llm, audio, TranscriptionOptions(temperature=0.0, beam_width=5), language="de")
        results[0].text, results[0].segments, results[0].error

    llm: an `LLM` (or its `LLMEngine`) running a Whisper model with its tokenizer.
    audio: one input or a list; an input is a file path, raw file bytes, a 16 kHz mono array, or an
        (array, sample_rate) tuple. Inputs that cannot be read give results with `.error` set.
    options: a TranscriptionOptions (default: its defaults); keyword overrides replace its fields, e.g.
        `transcribe(llm, files, language="de", timestamps=True, temperature=0.0)`. See TranscriptionOptions for
        every field; the defaults follow openai-whisper (temperature fallback 0.0 to 1.0, thresholds 2.4 / -1.0 /
        0.6). `temperature=0.0` alone decodes each window once, greedily (or with beam search, beam_width > 1),
        as transformers' `generate` does.
    """
    options = resolve_options(options, overrides)
    engine = getattr(llm, "llm_engine", llm)
    sources = [audio] if is_single_input(audio) else list(audio)
    return _Transcription(engine, sources, options).run()
