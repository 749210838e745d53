"""Beam search parameters for one request (vLLM's field names plus HF's early_stopping and the logits processors
of SamplingParams), validated at construction."""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

from seq2seq_engine.errors import ParameterError, ParameterTypeError
from seq2seq_engine.sampling_params import LOGITS_PROCESSOR_FIELDS, SamplingParams, _check_int, check_float

# Scores divide by generated_len ** length_penalty in Python floats: beyond this, long hypotheses overflow or divide
# by zero (HF's usual values lie in [0.5, 2]).
MAX_LENGTH_PENALTY = 10.0


@dataclasses.dataclass
class BeamSearchParams:
    """Deterministic beam search with HF `generate(num_beams=...)` semantics.

    Finished hypotheses are ranked by `sum(token logprobs) / generated_len ** length_penalty`, where
    generated_len counts the new tokens including the final EOS. `early_stopping`: True stops a request as soon as
    it holds `beam_width` finished hypotheses; False stops when no running beam can still beat the worst of them
    (judged at the current length); "never" judges at the longest possible length when length_penalty > 0.
    The logits processors act on each beam's log-softmax row, as in HF's beam search; a stop string ends a
    candidate as a stop token does.
    """

    beam_width: int
    max_tokens: int
    ignore_eos: bool = False
    temperature: float = 0.0
    length_penalty: float = 1.0
    include_stop_str_in_output: bool = False
    early_stopping: Union[bool, str] = False
    min_tokens: int = 0
    stop_token_ids: Optional[List[int]] = None
    stop: Optional[Union[str, List[str]]] = None      # a candidate whose text completes one ends its beam
    # The logits processors, as SamplingParams (same names, defaults, validation); they act on log-prob rows.
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logits_processors: Optional[List[Callable[[List[int], Any], Any]]] = None
    no_repeat_ngram_size: int = 0
    bad_words: Optional[List[str]] = None
    bad_words_ids: Optional[List[List[int]]] = None
    forced_bos_token_id: Optional[int] = None
    forced_eos_token_id: Optional[int] = None
    suppress_tokens: Optional[List[int]] = None
    begin_suppress_tokens: Optional[List[int]] = None
    logit_bias: Optional[Dict[int, float]] = None
    allowed_token_ids: Optional[List[int]] = None
    # As SamplingParams: fn(raw logits row) called once at each named decoder-prompt position.
    prompt_logits_hooks: Optional[List[Tuple[int, Callable[[Any], None]]]] = None

    def __post_init__(self) -> None:
        _check_int("beam_width", self.beam_width, 1)
        _check_int("max_tokens", self.max_tokens, 1)
        check_float("temperature", self.temperature)
        if self.temperature != 0:
            raise ParameterError(f"temperature must be 0: beam search is deterministic, got {self.temperature}",
                                 "temperature")
        check_float("length_penalty", self.length_penalty, -MAX_LENGTH_PENALTY, MAX_LENGTH_PENALTY)
        if not (self.early_stopping is True or self.early_stopping is False or self.early_stopping == "never"):
            raise ParameterError(f"early_stopping must be True, False or 'never', got {self.early_stopping!r}",
                                 "early_stopping")
        for name in ("ignore_eos", "include_stop_str_in_output"):
            if not isinstance(getattr(self, name), bool):
                raise ParameterTypeError(f"{name} must be a bool, got {type(getattr(self, name)).__name__}", name)
        # SamplingParams validates (and normalises: a str stop becomes a list, tuples lists) every shared field.
        sampling = self.to_sampling_params()
        for name in ("min_tokens", "stop_token_ids", "stop", "prompt_logits_hooks") + LOGITS_PROCESSOR_FIELDS:
            setattr(self, name, getattr(sampling, name))

    def to_sampling_params(self) -> SamplingParams:
        """The per-sequence settings the rest of the engine reads (length caps, stop tokens and strings,
        detokenizing, logits processors)."""
        return SamplingParams(n=1, temperature=0.0, max_tokens=self.max_tokens, min_tokens=self.min_tokens,
                              stop_token_ids=self.stop_token_ids, stop=self.stop, ignore_eos=self.ignore_eos,
                              include_stop_str_in_output=self.include_stop_str_in_output,
                              prompt_logits_hooks=self.prompt_logits_hooks,
                              **{name: getattr(self, name) for name in LOGITS_PROCESSOR_FIELDS})
