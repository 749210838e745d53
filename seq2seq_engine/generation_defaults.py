"""A model's `generation_config.json` as request defaults: SamplingParams / BeamSearchParams built from it.

HF counts `max_length` / `min_length` over the whole decoder sequence (decoder prompt included); the engine counts
generated tokens. The conversion therefore needs the request's decoder prompt length:
    max_tokens = max_new_tokens  or  max_length - decoder_prompt_len
    min_tokens = min_new_tokens  or  max(0, min_length - decoder_prompt_len)
With BART's default decoder prompt `[decoder_start, bos]` this gives the same sequences as HF `generate` with
`forced_bos_token_id = bos` (HF forces the BOS as its first new token; the engine has it in the prompt).

Keyword overrides win over the file; `None` overrides are ignored, so CLI flags can be passed straight through.
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Dict, Mapping, Optional, Union

from seq2seq_engine.beam_search_params import BeamSearchParams
from seq2seq_engine.errors import ParameterError
from seq2seq_engine.sampling_params import SamplingParams

# generation_config.json keys that map one to one onto a SamplingParams field of another name or the same name.
_PROCESSOR_FIELDS = {
    "no_repeat_ngram_size": "no_repeat_ngram_size", "repetition_penalty": "repetition_penalty",
    "forced_bos_token_id": "forced_bos_token_id", "forced_eos_token_id": "forced_eos_token_id",
    "suppress_tokens": "suppress_tokens", "begin_suppress_tokens": "begin_suppress_tokens",
    "bad_words_ids": "bad_words_ids",
}
# HF's own defaults for the keys that change behaviour when absent from the file.
_HF_DEFAULTS = {"max_length": 20, "num_beams": 1, "do_sample": False, "temperature": 1.0, "top_k": 50,
                "top_p": 1.0, "length_penalty": 1.0, "early_stopping": False}
GenerationParams = Union[SamplingParams, BeamSearchParams]


@dataclasses.dataclass(frozen=True)
class GenerationDefaults:
    """The generation settings a model ships with (HF semantics), turned into request parameters."""

    values: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @classmethod
    def from_model_dir(cls, model_dir: Optional[str]) -> "GenerationDefaults":
        """Read `generation_config.json` (absent file: HF's defaults). A malformed file is a ValueError."""
        if not model_dir:
            return cls()
        path = os.path.join(model_dir, "generation_config.json")
        if not os.path.isfile(path):
            return cls()
        try:
            with open(path, encoding="utf-8") as f:
                values = json.load(f)
        except ValueError as error:
            raise ValueError(f"{path} is not valid JSON: {error}") from None
        if not isinstance(values, dict):
            raise ValueError(f"{path} must hold a JSON object, got {type(values).__name__}")
        return cls({key: value for key, value in values.items() if value is not None})

    def get(self, key: str) -> Any:
        return self.values.get(key, _HF_DEFAULTS.get(key))

    @property
    def uses_beam_search(self) -> bool:
        return int(self.get("num_beams")) > 1 and not self.get("do_sample")

    def _lengths(self, decoder_prompt_len: int, max_model_len: Optional[int],
                 overrides: Mapping[str, Any]) -> Dict[str, int]:
        """max_tokens / min_tokens: the overrides, else the file's lengths converted (min capped at max)."""
        max_tokens = overrides.get("max_tokens")
        if max_tokens is None:
            max_tokens = self.values.get("max_new_tokens")
        if max_tokens is None:
            max_tokens = max(1, int(self.get("max_length")) - decoder_prompt_len)
            if max_model_len is not None:
                max_tokens = max(1, min(max_tokens, max_model_len - decoder_prompt_len))
        min_tokens = overrides.get("min_tokens")
        if min_tokens is None:
            min_tokens = self.values.get("min_new_tokens")
            if min_tokens is None:
                min_tokens = max(0, int(self.values.get("min_length", 0)) - decoder_prompt_len)
            min_tokens = int(min_tokens)
            if _is_int(max_tokens):  # else SamplingParams names max_tokens' type
                min_tokens = min(min_tokens, max_tokens)
        return {"max_tokens": max_tokens, "min_tokens": min_tokens}

    def _processor_fields(self, params_type: type) -> Dict[str, Any]:
        """The file's processor settings that `params_type` has a field for."""
        names = {field.name for field in dataclasses.fields(params_type)}
        return {field: self.values[key] for key, field in _PROCESSOR_FIELDS.items()
                if key in self.values and field in names}

    def sampling_params(self, decoder_prompt_len: int, max_model_len: Optional[int] = None,
                        **overrides: Any) -> SamplingParams:
        """SamplingParams from the file (greedy unless do_sample), then the non-None overrides."""
        _check_overrides(overrides, SamplingParams, "sampling (beam_width 1)")
        fields: Dict[str, Any] = {**self._lengths(decoder_prompt_len, max_model_len, overrides),
                                  **self._processor_fields(SamplingParams)}
        if self.get("do_sample"):
            fields.update(temperature=float(self.get("temperature")), top_p=float(self.get("top_p")),
                          top_k=int(self.get("top_k")) if self.get("top_k") else -1)
        else:
            fields["temperature"] = 0.0
        fields.update({key: value for key, value in overrides.items() if value is not None})
        return SamplingParams(**fields)

    def beam_search_params(self, decoder_prompt_len: int, max_model_len: Optional[int] = None,
                           **overrides: Any) -> BeamSearchParams:
        """BeamSearchParams from the file (num_beams, length_penalty, early_stopping, lengths, processors)."""
        _check_overrides(overrides, BeamSearchParams, "beam search")
        fields: Dict[str, Any] = {**self._lengths(decoder_prompt_len, max_model_len, overrides),
                                  **self._processor_fields(BeamSearchParams),
                                  "beam_width": max(1, int(self.get("num_beams"))),
                                  "length_penalty": float(self.get("length_penalty")),
                                  "early_stopping": self.get("early_stopping")}
        fields.update({key: value for key, value in overrides.items() if value is not None})
        return BeamSearchParams(**fields)

    def request_params(self, decoder_prompt_len: int, max_model_len: Optional[int] = None,
                       **overrides: Any) -> GenerationParams:
        """Beam search when the overrides give a beam_width > 1, or the file asks for beams (num_beams > 1, no
        sampling) and the overrides neither set beam_width nor a temperature > 0; sampling/greedy otherwise."""
        beam_width = overrides.get("beam_width")
        temperature = overrides.get("temperature")
        wants_sampling = isinstance(temperature, (int, float)) and temperature > 0
        if beam_width is not None and (not _is_int(beam_width) or beam_width > 1) or (
                beam_width is None and self.uses_beam_search and not wants_sampling):
            return self.beam_search_params(decoder_prompt_len, max_model_len, **overrides)
        overrides = {key: value for key, value in overrides.items()
                     if key not in ("beam_width", "length_penalty", "early_stopping")}
        return self.sampling_params(decoder_prompt_len, max_model_len, **overrides)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_overrides(overrides: Mapping[str, Any], params_type: type, mode: str) -> None:
    names = {field.name for field in dataclasses.fields(params_type)}
    unknown = sorted(key for key, value in overrides.items() if value is not None and key not in names)
    if unknown:
        raise ParameterError(f"{', '.join(unknown)} cannot be set for {mode} ({params_type.__name__}); "
                             f"its fields are: {', '.join(sorted(names))}", unknown[0])
