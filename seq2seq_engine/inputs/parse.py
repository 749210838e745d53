"""Classify a user prompt as text, tokens or explicit encoder/decoder, validating every field on the way."""
from __future__ import annotations

import dataclasses
import numbers
from typing import Any, Dict, List, Mapping, Optional, Union

SINGLETON_KEYS = frozenset({"prompt", "prompt_token_ids", "multi_modal_data"})
EXPLICIT_KEYS = frozenset({"encoder_prompt", "decoder_prompt"})
# "audio": (samples, sample_rate); "input_features": precomputed log-mel features [n_mels, frames].
SUPPORTED_MODALITIES = frozenset({"audio", "input_features"})


@dataclasses.dataclass(frozen=True)
class ParsedSingletonPrompt:
    """One validated singleton prompt: exactly one of `text` / `token_ids` is set.

    `kind` is "text" for a `str` or `TextPrompt`, "tokens" for a `TokensPrompt`.
    """

    kind: str
    text: Optional[str] = None
    token_ids: Optional[List[int]] = None
    multi_modal_data: Optional[Dict[str, Any]] = None

    @property
    def has_audio(self) -> bool:
        return bool(self.multi_modal_data) and not SUPPORTED_MODALITIES.isdisjoint(self.multi_modal_data)


@dataclasses.dataclass(frozen=True)
class ParsedExplicitPrompt:
    """A validated `ExplicitEncoderDecoderPrompt`; `decoder is None` asks for the model's default decoder prompt."""

    encoder: ParsedSingletonPrompt
    decoder: Optional[ParsedSingletonPrompt]


ParsedPrompt = Union[ParsedSingletonPrompt, ParsedExplicitPrompt]


def _join(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key


def is_explicit_encoder_decoder_prompt(prompt: Any) -> bool:
    """True for a mapping that carries `encoder_prompt` or `decoder_prompt` (it must then be a full explicit prompt)."""
    return isinstance(prompt, Mapping) and any(key in prompt for key in EXPLICIT_KEYS)


def parse_token_ids(token_ids: Any, field: str = "prompt_token_ids") -> List[int]:
    """Validate a sequence of token ids (list, tuple, or an array with `tolist`) and return it as a list of ints."""
    if hasattr(token_ids, "tolist") and not isinstance(token_ids, (list, tuple)):
        token_ids = token_ids.tolist()
    if not isinstance(token_ids, (list, tuple)):
        raise TypeError(f"{field} must be a list of ints, got {type(token_ids).__name__}")
    for index, token_id in enumerate(token_ids):
        if not isinstance(token_id, numbers.Integral) or isinstance(token_id, bool):
            raise TypeError(f"{field}[{index}] must be an int, got {type(token_id).__name__} ({token_id!r})")
    return [int(token_id) for token_id in token_ids]


def _parse_audio(audio: Any, field: str) -> None:
    if not isinstance(audio, tuple) or len(audio) != 2:
        raise TypeError(f"{field} must be an (array, sample_rate) tuple, got {type(audio).__name__}")
    samples, sample_rate = audio
    if isinstance(samples, (str, bytes)) or not (hasattr(samples, "shape") or isinstance(samples, (list, tuple))):
        raise TypeError(f"{field}[0] must be an array of samples, got {type(samples).__name__}")
    if len(samples) == 0:
        raise ValueError(f"{field}[0] holds no samples")
    if not isinstance(sample_rate, numbers.Integral) or isinstance(sample_rate, bool):
        raise TypeError(f"{field}[1] (sample rate) must be an int, got {type(sample_rate).__name__}")
    if sample_rate <= 0:
        raise ValueError(f"{field}[1] (sample rate) must be > 0, got {sample_rate}")


def _parse_features(features: Any, field: str) -> None:
    shape = getattr(features, "shape", None)
    if shape is None or len(shape) != 2 or 0 in tuple(shape):
        raise TypeError(f"{field} must be a non-empty 2-D array [n_mels, frames], got shape {shape}")


def parse_multi_modal_data(data: Any, field: str = "multi_modal_data") -> Optional[Dict[str, Any]]:
    """Validate `multi_modal_data`: "audio" -> (array, sample_rate) or "input_features" -> [n_mels, frames]."""
    if data is None:
        return None
    if not isinstance(data, Mapping):
        raise TypeError(f"{field} must be a dict, got {type(data).__name__}")
    unknown = sorted(set(data) - SUPPORTED_MODALITIES, key=str)
    if unknown:
        raise ValueError(f"{field} has unsupported modalities {unknown}; supported: {sorted(SUPPORTED_MODALITIES)}")
    if "audio" in data:
        _parse_audio(data["audio"], _join(field, "audio"))
    if "input_features" in data:
        _parse_features(data["input_features"], _join(field, "input_features"))
    if len(data) > 1:
        raise ValueError(f"{field} takes one of {sorted(SUPPORTED_MODALITIES)}, got {sorted(data)}")
    return dict(data)


def _check_keys(prompt: Mapping, allowed: frozenset, field: str) -> None:
    non_str = [key for key in prompt if not isinstance(key, str)]
    unknown = sorted(map(str, non_str)) + sorted(key for key in prompt if isinstance(key, str) and key not in allowed)
    if unknown:
        where = field or "prompt"
        raise ValueError(f"{where} has unknown keys {unknown}; allowed keys: {sorted(allowed)}")


def parse_singleton_prompt(prompt: Any, field: str = "") -> ParsedSingletonPrompt:
    """Parse a `str`, `TextPrompt` or `TokensPrompt`; `field` prefixes error messages (e.g. "encoder_prompt")."""
    if isinstance(prompt, str):
        return ParsedSingletonPrompt(kind="text", text=prompt)
    if not isinstance(prompt, Mapping):
        where = field or "prompt"
        raise TypeError(f"{where} must be a str, TextPrompt or TokensPrompt, got {type(prompt).__name__}")
    if is_explicit_encoder_decoder_prompt(prompt):
        raise ValueError(f"{field or 'prompt'} must be a singleton prompt, not a nested explicit encoder/decoder "
                         f"prompt (keys encoder_prompt/decoder_prompt are only allowed at the top level)")
    _check_keys(prompt, SINGLETON_KEYS, field)
    mm_data = parse_multi_modal_data(prompt.get("multi_modal_data"), _join(field, "multi_modal_data"))
    has_text, has_tokens = "prompt" in prompt, "prompt_token_ids" in prompt
    if has_text and has_tokens:
        raise ValueError(f"{field or 'prompt'} must have only one of 'prompt' and 'prompt_token_ids', not both")
    if has_text:
        text = prompt["prompt"]
        if not isinstance(text, str):
            raise TypeError(f"{_join(field, 'prompt')} must be a str, got {type(text).__name__}")
        return ParsedSingletonPrompt(kind="text", text=text, multi_modal_data=mm_data)
    if has_tokens:
        token_ids = parse_token_ids(prompt["prompt_token_ids"], _join(field, "prompt_token_ids"))
        return ParsedSingletonPrompt(kind="tokens", token_ids=token_ids, multi_modal_data=mm_data)
    raise ValueError(f"{field or 'prompt'} must have a 'prompt' or a 'prompt_token_ids' key")


def parse_explicit_prompt(prompt: Mapping) -> ParsedExplicitPrompt:
    """Parse an `ExplicitEncoderDecoderPrompt`; `encoder_prompt` is required, `decoder_prompt` may be None/absent."""
    _check_keys(prompt, EXPLICIT_KEYS, "")
    if "encoder_prompt" not in prompt:
        raise ValueError("encoder_prompt is required in an explicit encoder/decoder prompt (only decoder_prompt given)")
    encoder = parse_singleton_prompt(prompt["encoder_prompt"], "encoder_prompt")
    decoder_prompt = prompt.get("decoder_prompt")
    decoder = None if decoder_prompt is None else parse_singleton_prompt(decoder_prompt, "decoder_prompt")
    return ParsedExplicitPrompt(encoder=encoder, decoder=decoder)


def parse_prompt(prompt: Any) -> ParsedPrompt:
    """Classify any accepted prompt form; raises TypeError/ValueError naming the offending field."""
    if is_explicit_encoder_decoder_prompt(prompt):
        return parse_explicit_prompt(prompt)
    return parse_singleton_prompt(prompt)
