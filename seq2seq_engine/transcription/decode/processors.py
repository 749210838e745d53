"""Whisper's logits processors as per-request callables `fn(output_token_ids, logits_row) -> logits_row`.

They follow transformers' `SuppressTokensLogitsProcessor`, `SuppressTokensAtBeginLogitsProcessor` and
`WhisperTimeStampLogitsProcessor` (transformers/generation/logits_process.py) rule for rule, on one row: the engine
hands a processor the tokens generated so far (without the prompt), which is HF's `input_ids[begin_index:]` when
`begin_index` is the prompt length, as `WhisperForConditionalGeneration.generate` sets it. `whisper_processors`
returns them in the order generate applies them: begin-suppress, suppress, timestamps.

Each processor masks the row in place (entries set to -inf) and returns it.
"""
from __future__ import annotations

from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import torch

from seq2seq_engine.transcription.prompts import WhisperTokens

_NEG_INF = float("-inf")


class _IdSet:
    """A fixed set of token ids as an index tensor, cached per device (ids outside the row are dropped)."""

    def __init__(self, token_ids: Iterable[int]) -> None:
        self.token_ids = sorted({int(t) for t in token_ids})
        self._cache: Dict[Tuple[str, int], torch.Tensor] = {}

    def index(self, row: torch.Tensor) -> torch.Tensor:
        key = (str(row.device), row.shape[-1])
        index = self._cache.get(key)
        if index is None:
            ids = [t for t in self.token_ids if 0 <= t < row.shape[-1]]
            index = torch.tensor(ids, dtype=torch.long, device=row.device)
            self._cache[key] = index
        return index


class SuppressTokens:
    """Every step: the given tokens get -inf (HF `SuppressTokensLogitsProcessor`)."""

    def __init__(self, suppress_tokens: Iterable[int]) -> None:
        self.ids = _IdSet(suppress_tokens)

    def __call__(self, output_token_ids: Sequence[int], logits: torch.Tensor) -> torch.Tensor:
        return logits.index_fill_(-1, self.ids.index(logits), _NEG_INF)


class SuppressTokensAtBegin:
    """At the first generated step only: the given tokens get -inf (HF `SuppressTokensAtBeginLogitsProcessor`;
    Whisper's blank " " and <|endoftext|>, so a transcript never starts empty)."""

    def __init__(self, begin_suppress_tokens: Iterable[int]) -> None:
        self.ids = _IdSet(begin_suppress_tokens)

    def __call__(self, output_token_ids: Sequence[int], logits: torch.Tensor) -> torch.Tensor:
        if len(output_token_ids) == 0:
            logits.index_fill_(-1, self.ids.index(logits), _NEG_INF)
        return logits


class WhisperTimestamps:
    """Timestamp rules of HF `WhisperTimeStampLogitsProcessor` (from openai-whisper's `ApplyTimestampRules`):

    * `<|notimestamps|>` is never sampled;
    * timestamps come in pairs, except right before `<|endoftext|>`: after text + one timestamp only another
      timestamp or eos (ids >= eos) may follow; after two timestamps only text;
    * timestamps never decrease (and a closed pair's timestamp is not repeated);
    * the first token is a timestamp, at most `max_initial_timestamp_index` steps (0.02 s each) in;
    * when the timestamps together are more probable than the most probable text token, a timestamp is forced.
    """

    def __init__(self, no_timestamps_token_id: int, eos_token_id: int,
                 max_initial_timestamp_index: Optional[int] = None, detect_timestamp_from_logprob: bool = True) -> None:
        self.no_timestamps_token_id = int(no_timestamps_token_id)
        self.timestamp_begin = self.no_timestamps_token_id + 1
        self.eos_token_id = int(eos_token_id)
        self.max_initial_timestamp_index = max_initial_timestamp_index
        self.detect_timestamp_from_logprob = detect_timestamp_from_logprob

    def __call__(self, output_token_ids: Sequence[int], logits: torch.Tensor) -> torch.Tensor:
        begin = self.timestamp_begin
        logits[self.no_timestamps_token_id] = _NEG_INF
        seq = output_token_ids
        last_was_timestamp = len(seq) >= 1 and seq[-1] >= begin
        penultimate_was_timestamp = len(seq) < 2 or seq[-2] >= begin
        if last_was_timestamp:
            if penultimate_was_timestamp:  # a pair is closed: text must follow
                logits[begin:] = _NEG_INF
            else:  # text then one timestamp: another timestamp (the pair) or eos
                logits[:self.eos_token_id] = _NEG_INF
        # Timestamps do not decrease; <|0.00|> (any timestamp below the next allowed one) is not repeated.
        last_timestamp = next((token for token in reversed(seq) if token >= begin), None)
        if last_timestamp is not None:
            lowest = last_timestamp if (last_was_timestamp and not penultimate_was_timestamp) else last_timestamp + 1
        else:
            lowest = begin
        if lowest > begin:
            logits[begin:lowest] = _NEG_INF
        if len(seq) == 0:  # the first token is a timestamp, not too late
            logits[:begin] = _NEG_INF
            if self.max_initial_timestamp_index is not None:
                logits[begin + self.max_initial_timestamp_index + 1:] = _NEG_INF
        if self.detect_timestamp_from_logprob:
            logprobs = torch.log_softmax(logits.float(), dim=-1)
            timestamp_logprob = logprobs[begin:].logsumexp(dim=-1)
            max_text_token_logprob = logprobs[:begin].max()
            if timestamp_logprob > max_text_token_logprob:
                logits[:begin] = _NEG_INF
        return logits


class OnlyTokens:
    """Every entry except the given tokens gets -inf: with greedy sampling the request returns the argmax over
    them, and its logprob is the log-softmax over them alone (language detection: openai `detect_language`)."""

    def __init__(self, allowed_tokens: Iterable[int]) -> None:
        self.ids = _IdSet(allowed_tokens)
        self._masks: Dict[Tuple[str, int], torch.Tensor] = {}

    def __call__(self, output_token_ids: Sequence[int], logits: torch.Tensor) -> torch.Tensor:
        key = (str(logits.device), logits.shape[-1])
        mask = self._masks.get(key)
        if mask is None:
            mask = torch.ones(logits.shape[-1], dtype=torch.bool, device=logits.device)
            mask[self.ids.index(logits)] = False
            self._masks[key] = mask
        return logits.masked_fill_(mask, _NEG_INF)


def whisper_processors(tokens: WhisperTokens, timestamps: bool) -> List:
    """The processors HF's Whisper generate applies, in its order: begin-suppress, suppress, timestamps."""
    processors: List = []
    if tokens.begin_suppress_tokens:
        processors.append(SuppressTokensAtBegin(tokens.begin_suppress_tokens))
    if tokens.suppress_tokens:
        processors.append(SuppressTokens(tokens.suppress_tokens))
    if timestamps:
        processors.append(WhisperTimestamps(tokens.no_timestamps, tokens.eot, tokens.max_initial_timestamp_index))
    return processors
