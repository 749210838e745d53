"""Whisper's temperature-fallback and no-speech rules (openai-whisper) over one decoded attempt of a window."""
from __future__ import annotations

import dataclasses
import enum
import zlib
from typing import List, Optional, Sequence, Tuple


def compression_ratio(text: str) -> float:
    """UTF-8 bytes of the text over the bytes zlib (level 6, as `zlib.compress`) makes of them."""
    data = text.encode("utf-8")
    return len(data) / len(zlib.compress(data))


def average_logprob(cumulative_logprob: float, num_tokens: int) -> float:
    """openai-whisper's avg_logprob: the sampled tokens' logprobs, `<|endoftext|>`'s included, over the number of
    tokens before it plus one."""
    return cumulative_logprob / (num_tokens + 1)


def rank_score(cumulative_logprob: float, num_tokens: int) -> float:
    """How openai-whisper ranks best_of samples (MaximumLikelihoodRanker without length_penalty): the sum of the
    logprobs over the number of tokens before `<|endoftext|>`."""
    return cumulative_logprob / max(num_tokens, 1)


def best_sample(samples: Sequence[Tuple[List[int], float]]) -> Tuple[List[int], float]:
    """The (token_ids, cumulative_logprob) with the highest rank_score (the first of equals)."""
    return max(samples, key=lambda sample: rank_score(sample[1], len(sample[0])))


@dataclasses.dataclass(frozen=True)
class Attempt:
    """One decoding of one window at one temperature."""

    token_ids: List[int]            # generated, without <|endoftext|>
    text: str                       # their text, stripped
    temperature: float
    avg_logprob: float
    compression_ratio: float
    no_speech_prob: Optional[float]  # P(<|nospeech|>) after <|startoftranscript|>; None when not measured
    audio_seconds: Optional[float] = None  # the window's audio (not its padding); None when not known


# Below this much audio in a window, a likely no-speech window gives no text whatever its tokens' likelihood.
SHORT_AUDIO_SECONDS = 1.0


@dataclasses.dataclass(frozen=True)
class Thresholds:
    compression_ratio: Optional[float] = 2.4
    log_prob: Optional[float] = -1.0
    no_speech: Optional[float] = 0.6


class Verdict(enum.Enum):
    ACCEPT = "accept"    # keep the attempt's text
    RETRY = "retry"      # decode the window again at the next temperature
    SILENCE = "silence"  # keep the attempt, without text: the window is silent


def looks_silent(attempt: Attempt, limits: Thresholds) -> bool:
    """The fallback's silence test: likely no speech and unlikely tokens."""
    return (limits.no_speech is not None and attempt.no_speech_prob is not None
            and attempt.no_speech_prob > limits.no_speech
            and limits.log_prob is not None and attempt.avg_logprob < limits.log_prob)


def needs_fallback(attempt: Attempt, limits: Thresholds) -> bool:
    """Too repetitive or too unlikely, and not silent."""
    failed = ((limits.compression_ratio is not None and attempt.compression_ratio > limits.compression_ratio)
              or (limits.log_prob is not None and attempt.avg_logprob < limits.log_prob))
    return failed and not looks_silent(attempt, limits)


def should_skip(attempt: Attempt, limits: Thresholds) -> bool:
    """openai-whisper's no-voice check on the kept attempt: likely no speech, unless its tokens are likely enough.
    A window of under SHORT_AUDIO_SECONDS of audio is skipped on the no-speech test alone: on such scraps Whisper's
    stock phrases ("Thank you.", "Thanks for watching.") come out confident, so their likelihood proves nothing
    (decisions §72)."""
    if limits.no_speech is None or attempt.no_speech_prob is None or attempt.no_speech_prob <= limits.no_speech:
        return False
    if attempt.audio_seconds is not None and attempt.audio_seconds < SHORT_AUDIO_SECONDS:
        return True
    return not (limits.log_prob is not None and attempt.avg_logprob > limits.log_prob)


def verdict(attempt: Attempt, limits: Thresholds, has_next_temperature: bool) -> Verdict:
    """openai-whisper's `decode_with_fallback` and no-voice check: an attempt *fails* when its text compresses too
    well (`compression_ratio > compression_ratio_threshold`: a repetition loop) or its tokens are unlikely
    (`avg_logprob < log_prob_threshold`), unless it looks silent; a failed attempt is retried at the next
    temperature; the last temperature's attempt is kept whatever it scores, and a kept attempt is silence (no text)
    when `no_speech_prob > no_speech_threshold`, unless `avg_logprob > log_prob_threshold`."""
    if has_next_temperature and needs_fallback(attempt, limits):
        return Verdict.RETRY
    return Verdict.SILENCE if should_skip(attempt, limits) else Verdict.ACCEPT
