"""Beam search parameters for one request (vLLM's field names plus HF's early_stopping), validated at construction."""
from __future__ import annotations

import dataclasses
from typing import List, Optional, Union

from seq2seq_engine.sampling_params import SamplingParams, _check_int


@dataclasses.dataclass
class BeamSearchParams:
    """Deterministic beam search with HF `generate(num_beams=...)` semantics.

    Finished hypotheses are ranked by `sum(token logprobs) / generated_len ** length_penalty`, where
    generated_len counts the new tokens including the final EOS. `early_stopping`: True stops a request as soon as
    it holds `beam_width` finished hypotheses; False stops when no running beam can still beat the worst of them
    (judged at the current length); "never" judges at the longest possible length when length_penalty > 0.
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

    def __post_init__(self) -> None:
        self.stop_token_ids = list(self.stop_token_ids or [])
        _check_int("beam_width", self.beam_width, 1)
        _check_int("max_tokens", self.max_tokens, 1)
        _check_int("min_tokens", self.min_tokens, 0)
        if self.min_tokens > self.max_tokens:
            raise ValueError(f"min_tokens ({self.min_tokens}) must be <= max_tokens ({self.max_tokens})")
        if not isinstance(self.temperature, (int, float)) or isinstance(self.temperature, bool):
            raise TypeError(f"temperature must be a number, got {type(self.temperature).__name__}")
        if self.temperature != 0:
            raise ValueError(f"beam search is deterministic: temperature must be 0, got {self.temperature}")
        if not isinstance(self.length_penalty, (int, float)) or isinstance(self.length_penalty, bool):
            raise TypeError(f"length_penalty must be a number, got {type(self.length_penalty).__name__}")
        if not (self.early_stopping is True or self.early_stopping is False or self.early_stopping == "never"):
            raise ValueError(f"early_stopping must be True, False or 'never', got {self.early_stopping!r}")
        for name in ("ignore_eos", "include_stop_str_in_output"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be a bool, got {type(getattr(self, name)).__name__}")
        if any(not isinstance(t, int) or isinstance(t, bool) or t < 0 for t in self.stop_token_ids):
            raise ValueError(f"stop_token_ids must hold non-negative ints, got {self.stop_token_ids!r}")

    def to_sampling_params(self) -> SamplingParams:
        """The per-sequence settings the rest of the engine reads (length caps, stop tokens, detokenizing)."""
        return SamplingParams(n=1, temperature=0.0, max_tokens=self.max_tokens, min_tokens=self.min_tokens,
                              stop_token_ids=list(self.stop_token_ids), ignore_eos=self.ignore_eos,
                              include_stop_str_in_output=self.include_stop_str_in_output)
