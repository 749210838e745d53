"""Sampling parameters for one request, with vLLM's field names, validated at construction."""
from __future__ import annotations

import dataclasses
import enum
import math
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

from seq2seq_engine.errors import ParameterError, ParameterTypeError

_SAMPLING_EPS = 1e-5


class SamplingType(enum.IntEnum):
    GREEDY = 0
    RANDOM = 1
    RANDOM_SEED = 2


# Integers go into int64 tensors and torch.Generator seeds; floats are applied in float32, where a larger magnitude
# is an infinity that turns the logits into NaN.
INT64_MAX = 2 ** 63 - 1
FLOAT32_MAX = 3.4028234663852886e38


def _bound_text(value: int) -> str:
    return "2**63-1" if value == INT64_MAX else str(value)


def _check_int(name: str, value, minimum: int, maximum: int = INT64_MAX) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ParameterTypeError(f"{name} must be an int, got {type(value).__name__}", name)
    if value < minimum:
        raise ParameterError(f"{name} must be >= {minimum}, got {value}", name)
    if value > maximum:
        raise ParameterError(f"{name} must be <= {_bound_text(maximum)}, got {value}", name)


def is_finite_number(value) -> bool:
    """A bool-free int or float whose magnitude float32 can hold."""
    # abs() first: NaN compares False, and math.isfinite would overflow on a huge int
    return isinstance(value, (int, float)) and not isinstance(value, bool) and abs(value) <= FLOAT32_MAX


# Positive logits are divided by the penalty: below this, a float32 logit of a few hundred overflows to inf (and a
# penalty under float32's smallest subnormal becomes 0), so the step's softmax would give NaN.
REPETITION_PENALTY_MIN = 1e-6


def check_float(name: str, value, low: float = -math.inf, high: float = math.inf, low_open: bool = False) -> None:
    """A finite number (float32's range) in [low, high] (or (low, high] with low_open); errors name `name`."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise ParameterTypeError(f"{name} must be a number, got {type(value).__name__}", name)
    if not is_finite_number(value):
        raise ParameterError(f"{name} must be a finite number (at most {FLOAT32_MAX:.4g} in magnitude), got {value}",
                             name)
    too_low = value <= low if low_open else value < low
    if too_low or value > high:
        bracket = "(" if low_open else "["
        raise ParameterError(f"{name} must be in {bracket}{float(low)}, {float(high)}], got {value}", name)


def _is_token_id(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= INT64_MAX


def _check_token_ids(name: str, ids, allow_empty: bool = True) -> None:
    if not isinstance(ids, list) or any(not _is_token_id(t) for t in ids):
        raise ParameterError(f"{name} must be a list of non-negative int token ids (at most 2**63-1), got {ids!r}",
                             name)
    if not ids and not allow_empty:
        raise ParameterError(f"{name} must not be empty (leave it None to allow every token)", name)


def _check_token_sequences(name: str, sequences) -> None:
    if not isinstance(sequences, list) or any(not isinstance(s, list) or not s for s in sequences):
        raise ParameterError(f"{name} must be a list of non-empty lists of token ids, got {sequences!r}", name)
    for sequence in sequences:
        _check_token_ids(name, sequence)


def _check_prompt_logits_hooks(hooks) -> None:
    if not isinstance(hooks, list) or any(
            not isinstance(h, tuple) or len(h) != 2 or not _is_token_id(h[0]) or not callable(h[1]) for h in hooks):
        raise ParameterError(f"prompt_logits_hooks must be a list of (position >= 0, fn(logits_row)) pairs, got "
                             f"{hooks!r}", "prompt_logits_hooks")


def _check_logit_bias(logit_bias) -> None:
    if not isinstance(logit_bias, dict):
        raise ParameterTypeError(f"logit_bias must be a dict {{token_id: bias}}, got {type(logit_bias).__name__}",
                                 "logit_bias")
    for token_id, bias in logit_bias.items():
        if not _is_token_id(token_id):
            raise ParameterError(f"logit_bias keys must be non-negative int token ids (at most 2**63-1), got "
                                 f"{token_id!r}", "logit_bias")
        if not is_finite_number(bias):
            raise ParameterError(f"logit_bias values must be finite numbers (at most {FLOAT32_MAX:.4g} in magnitude), "
                                 f"got {bias!r} for token {token_id}", "logit_bias")


# The logits-processor fields (besides min_tokens), shared by BeamSearchParams: same names, defaults and validation.
LOGITS_PROCESSOR_FIELDS = ("presence_penalty", "frequency_penalty", "repetition_penalty", "logits_processors",
                           "no_repeat_ngram_size", "bad_words", "bad_words_ids", "forced_bos_token_id",
                           "forced_eos_token_id", "suppress_tokens", "begin_suppress_tokens", "logit_bias",
                           "allowed_token_ids")


@dataclasses.dataclass
class SamplingParams:
    """How to generate for one request. `max_tokens=None` means up to the model's length limit."""

    n: int = 1
    best_of: Optional[int] = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    seed: Optional[int] = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    stop: Optional[Union[str, List[str]]] = None
    stop_token_ids: Optional[List[int]] = None
    ignore_eos: bool = False
    max_tokens: Optional[int] = 16
    min_tokens: int = 0
    logprobs: Optional[int] = None
    prompt_logprobs: Optional[int] = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    # vLLM-style per-request processors: fn(output_token_ids, logits_row) -> logits_row, applied in order
    # before sampling (the sampled logprob then comes from the processed row).
    logits_processors: Optional[List[Callable[[List[int], Any], Any]]] = None
    # Built-in logits processors (seq2seq_engine/sampling/logits_processors; HF transformers semantics unless noted).
    no_repeat_ngram_size: int = 0                     # n-grams of the decoder prompt + output occur at most once
    bad_words: Optional[List[str]] = None             # vLLM: each word tokenized with and without a leading space
    bad_words_ids: Optional[List[List[int]]] = None   # HF: token sequences that may never be completed
    forced_bos_token_id: Optional[int] = None         # forced when the decoder sequence has length 1
    forced_eos_token_id: Optional[int] = None         # forced as the last token before max_tokens / max_model_len
    suppress_tokens: Optional[List[int]] = None       # never sampled
    begin_suppress_tokens: Optional[List[int]] = None  # not sampled as the first generated token
    logit_bias: Optional[Dict[int, float]] = None     # OpenAI/vLLM: added to the token's logit
    allowed_token_ids: Optional[List[int]] = None     # vLLM: every other token is masked
    # (position, fn) pairs: fn(logits_row) is called once, while the decoder prompt is prefilled, with the raw logits
    # [vocab] at that decoder-prompt position (the distribution of the token after it; no logits processors).
    prompt_logits_hooks: Optional[List[Tuple[int, Callable[[Any], None]]]] = None
    # Filled by the engine from `bad_words` and its tokenizer (one clone per request); not for users.
    _bad_words_token_ids: Optional[List[List[int]]] = dataclasses.field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.best_of is None:
            self.best_of = self.n
        self.stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        self.logits_processors = list(self.logits_processors or [])
        for name in ("bad_words", "bad_words_ids", "suppress_tokens", "begin_suppress_tokens", "allowed_token_ids",
                     "_bad_words_token_ids"):
            value = getattr(self, name)
            if isinstance(value, (tuple, list)):
                setattr(self, name, [list(v) if isinstance(v, (tuple, list)) else v for v in value])
        if isinstance(self.prompt_logits_hooks, (tuple, list)):
            self.prompt_logits_hooks = [tuple(h) if isinstance(h, (tuple, list)) else h
                                        for h in self.prompt_logits_hooks]
        if self.logit_bias is not None and isinstance(self.logit_bias, dict):
            self.logit_bias = dict(self.logit_bias)
        self._validate()
        self._validate_processors()

    def _validate(self) -> None:
        _check_int("n", self.n, 1)
        _check_int("best_of", self.best_of, self.n)
        check_float("temperature", self.temperature, 0.0)
        check_float("top_p", self.top_p, 0.0, 1.0, low_open=True)
        _check_int("top_k", self.top_k, -1)
        if self.top_k == 0:
            raise ParameterError("top_k must be -1 (disabled) or at least 1, got 0", "top_k")
        check_float("min_p", self.min_p, 0.0, 1.0)
        if self.seed is not None:
            _check_int("seed", self.seed, 0)
        check_float("presence_penalty", self.presence_penalty, -2.0, 2.0)
        check_float("frequency_penalty", self.frequency_penalty, -2.0, 2.0)
        check_float("repetition_penalty", self.repetition_penalty, REPETITION_PENALTY_MIN)
        if self.max_tokens is not None:
            _check_int("max_tokens", self.max_tokens, 1)
        _check_int("min_tokens", self.min_tokens, 0)
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ParameterError(f"min_tokens ({self.min_tokens}) must be <= max_tokens ({self.max_tokens})",
                                 "min_tokens")
        for name in ("logprobs", "prompt_logprobs"):
            if getattr(self, name) is not None:
                _check_int(name, getattr(self, name), 0)
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise ParameterError(f"stop must hold non-empty strings, got {self.stop!r}", "stop")
        if any(not _is_token_id(t) for t in self.stop_token_ids):
            raise ParameterError(f"stop_token_ids must hold non-negative ints (at most 2**63-1), got "
                                 f"{self.stop_token_ids!r}", "stop_token_ids")
        if any(not callable(processor) for processor in self.logits_processors):
            raise ParameterTypeError("logits_processors must hold callables fn(output_token_ids, logits) -> logits",
                                     "logits_processors")
        if self.temperature < _SAMPLING_EPS and self.best_of > 1:
            raise ParameterError(f"best_of must be 1 for greedy sampling (temperature=0), got {self.best_of}",
                                 "best_of")

    def _validate_processors(self) -> None:
        _check_int("no_repeat_ngram_size", self.no_repeat_ngram_size, 0)
        if self.bad_words is not None and (not isinstance(self.bad_words, list)
                                           or any(not isinstance(w, str) or not w.strip() for w in self.bad_words)):
            raise ParameterError(f"bad_words must be a list of non-blank strings, got {self.bad_words!r}", "bad_words")
        for name in ("bad_words_ids", "_bad_words_token_ids"):
            if getattr(self, name) is not None:
                _check_token_sequences(name, getattr(self, name))
        for name in ("forced_bos_token_id", "forced_eos_token_id"):
            value = getattr(self, name)
            if value is not None and not _is_token_id(value):
                raise ParameterError(f"{name} must be a non-negative int token id or None (ids at most 2**63-1), "
                                     f"got {value!r}", name)
        for name in ("suppress_tokens", "begin_suppress_tokens"):
            if getattr(self, name) is not None:
                _check_token_ids(name, getattr(self, name))
        if self.logit_bias is not None:
            _check_logit_bias(self.logit_bias)
        if self.prompt_logits_hooks is not None:
            _check_prompt_logits_hooks(self.prompt_logits_hooks)
        if self.allowed_token_ids is not None:
            _check_token_ids("allowed_token_ids", self.allowed_token_ids, allow_empty=False)
            for name in ("forced_bos_token_id", "forced_eos_token_id"):
                forced = getattr(self, name)
                if forced is not None and forced not in self.allowed_token_ids:
                    raise ParameterError(f"{name}={forced} is not in allowed_token_ids, so it could never be forced",
                                         name)

    def verify_token_ids(self, vocab_size: int) -> None:
        """Every token id the request names must be < vocab_size (checked by the engine, which knows the model)."""
        singles = {"forced_bos_token_id": [self.forced_bos_token_id], "forced_eos_token_id": [self.forced_eos_token_id],
                   "suppress_tokens": self.suppress_tokens, "begin_suppress_tokens": self.begin_suppress_tokens,
                   "logit_bias": list(self.logit_bias or {}), "allowed_token_ids": self.allowed_token_ids}
        sequences = {"bad_words_ids": self.bad_words_ids, "bad_words": self._bad_words_token_ids}
        named = list(singles.items()) + [(name, [t for seq in seqs or [] for t in seq])
                                         for name, seqs in sequences.items()]
        for name, ids in named:
            for token_id in ids or []:
                if token_id is not None and token_id >= vocab_size:
                    raise ParameterError(f"{name} holds token id {token_id}, outside the model's vocabulary "
                                         f"[0, vocab_size) = [0, {vocab_size})", name)

    @property
    def all_bad_words_ids(self) -> List[List[int]]:
        """`bad_words_ids` followed by the tokenized `bad_words` (once the engine has tokenized them)."""
        return (self.bad_words_ids or []) + (self._bad_words_token_ids or [])

    @property
    def sampling_type(self) -> SamplingType:
        if self.temperature < _SAMPLING_EPS:
            return SamplingType.GREEDY
        return SamplingType.RANDOM_SEED if self.seed is not None else SamplingType.RANDOM

    def clone(self) -> "SamplingParams":
        return dataclasses.replace(self)
