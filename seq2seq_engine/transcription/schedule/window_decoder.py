"""What decoding a single window takes, shared by the call's WindowMachines: attempts, verdicts, tokens, words."""
from __future__ import annotations

import dataclasses
from typing import Any, List, Optional, Sequence, Tuple

import torch

from seq2seq_engine.engine_port import EnginePort
from seq2seq_engine.transcription.decode.decode_params import (DecodePlan, NoSpeechProbe, Params, WindowPrompt,
                                                               attempt_seed)
from seq2seq_engine.transcription.decode.fallback import Attempt, Verdict, verdict
from seq2seq_engine.transcription.decode.hallucination import drop_segments, hallucinated_segments
from seq2seq_engine.transcription.input.windows import Window, features_for
from seq2seq_engine.transcription.options import TranscriptionOptions
from seq2seq_engine.transcription.prompts import WhisperTokens
from seq2seq_engine.transcription.schedule.input_source import InputState
from seq2seq_engine.transcription.timing.segments import WindowTokens, split_segments
from seq2seq_engine.transcription.timing.word_timestamps import WordAligner
from seq2seq_engine.transcription.timing.words import WordTiming

SPLICE_SLACK_S = 1.0   # seconds of a packed piece a segment may reach into without being split there


class WindowDecoder:
    """The call's decoding of single windows, for its WindowMachines (window_machine.py): the prompts and each
    attempt's parameters (DecodePlan, one temperature per attempt), the Attempt a request made and fallback's
    verdict on it, and a final window's WindowTokens (whether its words are wanted: with word_timestamps, aligned
    before the samples are released; with them, without the segments hallucination_silence_threshold drops).
    With timestamps, a packed window (VAD) with a segment over a splice has its words timed too, shown or not: the
    segment is split there by them (segments.py)."""

    def __init__(self, engine: EnginePort, tokens: WhisperTokens, options: TranscriptionOptions) -> None:
        self.engine, self.tokens, self.options = engine, tokens, options
        self.plan = DecodePlan(engine, tokens, options)
        self.initial_tokens: List[int] = self.plan.initial_tokens
        self.words_always = options.word_timestamps or options.hallucination_silence_threshold is not None
        timed = self.words_always or (options.timestamps and options.vad_filter is not False)
        self.aligner = WordAligner(engine, tokens, options.lora_request) if timed else None

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

    def attempt_params(self, state: InputState, window: Window, prompt: WindowPrompt,
                       attempt: int) -> Tuple[Params, Optional[NoSpeechProbe]]:
        """The parameters decoding `window` at the attempt'th temperature (seeded per input, window and attempt),
        and the probe its P(<|nospeech|>) lands in."""
        seed = attempt_seed(self.options.seed, state.index, window.index, attempt)
        return self.plan.params(prompt, self.options.temperatures[attempt], seed)

    def attempt_of(self, output: Any, window: Window, attempt: int, probe: Optional[NoSpeechProbe]) -> Attempt:
        """The Attempt the attempt'th request of `window` made (its finished RequestOutput)."""
        result = self.plan.attempt(output, self.options.temperatures[attempt], probe, self.decode_text)
        return dataclasses.replace(result, audio_seconds=window.duration)

    def verdict(self, result: Attempt, attempt: int) -> Verdict:
        """Accept, silence, or retry at the next temperature (fallback.py), when there is one."""
        return verdict(result, self.plan.limits, attempt + 1 < len(self.options.temperatures))

    def kept_tokens(self, window: Window, token_ids: List[int], result: Optional[Attempt] = None) -> WindowTokens:
        """The final window's kept tokens and scores (none for a window not decoded), placed in the input, without
        words."""
        scores = {} if result is None else dict(temperature=result.temperature, avg_logprob=result.avg_logprob,
                                                compression_ratio=result.compression_ratio,
                                                no_speech_prob=result.no_speech_prob)
        return WindowTokens(window.offset, window.duration, token_ids, window.time_map, **scores)

    def wants_words(self, tokens: WindowTokens) -> bool:
        """Whether the final window's words are timed (word_timestamps, hallucination_silence_threshold, or a
        segment over a splice of a packed window); align them before the window's samples are released."""
        return self.aligner is not None and (self.words_always or self._crosses_splice(tokens))

    def _crosses_splice(self, tokens: WindowTokens) -> bool:
        """Whether a segment of a packed window covers more than SPLICE_SLACK_S of two of its pieces (its words
        then say where to split it; the features are made again for that pass, as in the engine, so the cached
        cross K/V are found). Less is a piece's padding, where Whisper's timestamps next to a splice reach."""
        if tokens.time_map is None or len(tokens.time_map.regions) < 2:
            return False
        segments = split_segments(tokens.token_ids, self.tokens, tokens.duration)
        return any(tokens.time_map.pieces_covered(start, end, SPLICE_SLACK_S) > 1 for start, end, _ in segments)

    def with_words(self, tokens: WindowTokens, words: List[List[WordTiming]]) -> WindowTokens:
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
