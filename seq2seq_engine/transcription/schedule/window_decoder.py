"""Each window's engine requests (language detection, decoding attempts) and the tokens its kept attempt leaves."""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, List, Optional, Sequence, Union

import torch

from seq2seq_engine.beam_search_params import BeamSearchParams
from seq2seq_engine.engine_port import EnginePort
from seq2seq_engine.sampling_params import SamplingParams
from seq2seq_engine.transcription.decode.decode_params import DecodePlan, WindowPrompt, attempt_seed
from seq2seq_engine.transcription.decode.fallback import Attempt, Verdict, verdict
from seq2seq_engine.transcription.decode.hallucination import drop_segments, hallucinated_segments
from seq2seq_engine.transcription.decode.language import detection_params, detection_prompt, parse_detection
from seq2seq_engine.transcription.input.windows import Window, features_for
from seq2seq_engine.transcription.options import TranscriptionOptions
from seq2seq_engine.transcription.prompts import WhisperTokens
from seq2seq_engine.transcription.schedule.input_source import InputFailed, InputState
from seq2seq_engine.transcription.timing.segments import WindowTokens, split_segments
from seq2seq_engine.transcription.timing.word_timestamps import WordAligner
from seq2seq_engine.transcription.timing.words import WordTiming

SPLICE_SLACK_S = 1.0   # seconds of a packed piece a segment may reach into without being split there


@dataclasses.dataclass
class WindowRequest:
    """One engine request for a window of `input_state`: `make_prompt` runs at admission (features are computed
    then, not before); `on_done` takes the finished RequestOutput."""

    input_state: InputState
    make_prompt: Callable[[], dict]
    params: Union[SamplingParams, BeamSearchParams]
    on_done: Callable[[Any], None]


class WindowDecoder:
    """The call's decoding of single windows: the requests (DecodePlan's prompts and parameters, one temperature
    per attempt), fallback's verdict on an attempt, and a final window's WindowTokens (with word_timestamps its
    words, aligned before the samples are released; without the segments hallucination_silence_threshold drops).
    With timestamps, a packed window (VAD) with a segment over a splice has its words timed too, shown or not: the
    segment is split there by them (segments.py)."""

    def __init__(self, engine: EnginePort, tokens: WhisperTokens, options: TranscriptionOptions) -> None:
        self.engine, self.tokens, self.options = engine, tokens, options
        self.plan = DecodePlan(engine, tokens, options)
        self.initial_tokens: List[int] = self.plan.initial_tokens
        self.words_always = options.word_timestamps or options.hallucination_silence_threshold is not None
        timed = self.words_always or (options.timestamps and options.vad_filter is not False)
        self.aligner = WordAligner(engine, tokens) if timed else None

    def decode_text(self, token_ids: List[int]) -> str:
        return self.engine.tokenizer.decode(token_ids, skip_special_tokens=True) if token_ids else ""

    def features(self, window: Window) -> torch.Tensor:
        """The window's log-mel features. With words timed for every window they are kept on the window until it is
        final (language detection, each attempt and the alignment pass read the same ones); otherwise made for each
        request."""
        if not self.words_always:
            return features_for(self.engine, window.samples)
        if window.features is None:
            window.features = features_for(self.engine, window.samples)
        return window.features

    def prompt(self, state: InputState, window: Window, previous: Sequence[int]) -> WindowPrompt:
        """The window's decoder prompt, conditioned on `previous` (the initial prompt or the text kept so far)."""
        return self.plan.prompt(state.language, window.index == 0, previous)

    def detection_request(self, state: InputState, window: Window,
                          on_language: Callable[[InputState], None]) -> WindowRequest:
        """The 1-token request detecting the input's language on `window`; `on_language(state)` once it is set
        (InputFailed when the output names no language)."""

        def on_done(output: Any) -> None:
            try:
                state.language, state.language_probability = parse_detection(output, self.tokens)
            except ValueError as error:
                raise InputFailed(state, str(error)) from error
            on_language(state)

        return WindowRequest(state, lambda: detection_prompt(self.tokens, self.features(window)),
                             detection_params(self.tokens), on_done)

    def attempt_request(self, state: InputState, window: Window, prompt: WindowPrompt, attempt: int,
                        on_attempt: Callable[[Attempt], None]) -> WindowRequest:
        """The request decoding `window` at the attempt'th temperature; `on_attempt` gets the Attempt it made."""
        temperature = self.options.temperatures[attempt]
        seed = attempt_seed(self.options.seed, state.index, window.index, attempt)
        params, probe = self.plan.params(prompt, temperature, seed)

        def make_prompt() -> dict:
            return {"prompt_token_ids": prompt.token_ids,
                    "multi_modal_data": {"input_features": self.features(window)}}

        def on_done(output: Any) -> None:
            result = self.plan.attempt(output, temperature, probe, self.decode_text)
            on_attempt(dataclasses.replace(result, audio_seconds=window.duration))

        return WindowRequest(state, make_prompt, params, on_done)

    def verdict(self, result: Attempt, attempt: int) -> Verdict:
        """Accept, silence, or retry at the next temperature (fallback.py), when there is one."""
        return verdict(result, self.plan.limits, attempt + 1 < len(self.options.temperatures))

    def final_tokens(self, state: InputState, window: Window, token_ids: List[int],
                     result: Optional[Attempt] = None) -> WindowTokens:
        """What the final window leaves: its kept tokens and scores (none for a window not decoded), placed in
        the input; call it before the window's samples are released."""
        scores = {} if result is None else dict(temperature=result.temperature, avg_logprob=result.avg_logprob,
                                                compression_ratio=result.compression_ratio,
                                                no_speech_prob=result.no_speech_prob)
        tokens = WindowTokens(window.offset, window.duration, token_ids, window.time_map, **scores)
        if self.aligner is None or not (self.words_always or self._crosses_splice(tokens)):
            return tokens
        words = self.aligner.window_words(self.features(window), token_ids, state.language, self.options.task,
                                          window.duration) if token_ids else []
        return self._without_hallucinations(tokens, words)

    def _crosses_splice(self, tokens: WindowTokens) -> bool:
        """Whether a segment of a packed window covers more than SPLICE_SLACK_S of two of its pieces (its words
        then say where to split it; the features are made again for that pass, as in the engine, so the cached
        cross K/V are found). Less is a piece's padding, where Whisper's timestamps next to a splice reach."""
        if tokens.time_map is None or len(tokens.time_map.regions) < 2:
            return False
        segments = split_segments(tokens.token_ids, self.tokens, tokens.duration)
        return any(tokens.time_map.pieces_covered(start, end, SPLICE_SLACK_S) > 1 for start, end, _ in segments)

    def _without_hallucinations(self, tokens: WindowTokens, words: List[List[WordTiming]]) -> WindowTokens:
        """The window with its words (word_timestamps) and without the segments hallucination_silence_threshold
        drops (hallucination.py)."""
        threshold = self.options.hallucination_silence_threshold
        dropped = set()
        if threshold is not None:
            dropped = hallucinated_segments(words, tokens.input_span, tokens.duration, threshold)
        token_ids = drop_segments(tokens.token_ids, self.tokens.is_timestamp, self.tokens.is_text, dropped)
        kept_words = [segment for index, segment in enumerate(words) if index not in dropped]
        return dataclasses.replace(tokens, token_ids=token_ids, words=kept_words,
                                   show_words=self.options.word_timestamps)
