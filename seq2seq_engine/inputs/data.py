"""Prompt types users pass in, and the processed inputs a request is built from."""
from __future__ import annotations

import dataclasses
from typing import Any, Dict, Generic, Iterable, List, Optional, Tuple, TypeVar, Union

from typing_extensions import NotRequired, TypedDict


class TextPrompt(TypedDict):
    """A text prompt, tokenized by the engine."""

    prompt: str
    multi_modal_data: NotRequired[Dict[str, Any]]


class TokensPrompt(TypedDict):
    """A prompt given as token ids."""

    prompt_token_ids: List[int]
    multi_modal_data: NotRequired[Dict[str, Any]]


SingletonPrompt = Union[str, TextPrompt, TokensPrompt]

_T1 = TypeVar("_T1", bound=SingletonPrompt)
_T2 = TypeVar("_T2", bound=SingletonPrompt)


class ExplicitEncoderDecoderPrompt(TypedDict, Generic[_T1, _T2]):
    """Both halves of an encoder/decoder prompt; `decoder_prompt=None` means the model's default decoder prompt."""

    encoder_prompt: _T1
    decoder_prompt: Optional[_T2]


PromptType = Union[SingletonPrompt, ExplicitEncoderDecoderPrompt]


def zip_enc_dec_prompts(encoder_prompts: Iterable[SingletonPrompt],
                        decoder_prompts: Iterable[Optional[SingletonPrompt]]) -> List[ExplicitEncoderDecoderPrompt]:
    """Pair encoder and decoder prompts one to one; the two lists must have the same length."""
    encoder_prompts, decoder_prompts = list(encoder_prompts), list(decoder_prompts)
    if len(encoder_prompts) != len(decoder_prompts):
        raise ValueError(f"zip_enc_dec_prompts needs lists of equal length, got {len(encoder_prompts)} encoder "
                         f"and {len(decoder_prompts)} decoder prompts")
    return [ExplicitEncoderDecoderPrompt(encoder_prompt=e, decoder_prompt=d)
            for e, d in zip(encoder_prompts, decoder_prompts)]


@dataclasses.dataclass(frozen=True)
class SingletonInputs:
    """One processed prompt: token ids, the text they came from (if any), and multi-modal data (audio)."""

    prompt_token_ids: Tuple[int, ...]
    prompt: Optional[str] = None
    multi_modal_data: Optional[Dict[str, Any]] = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "prompt_token_ids", tuple(self.prompt_token_ids))


@dataclasses.dataclass(frozen=True)
class EncoderDecoderInputs:
    """Processed inputs of one request. `encoder is None` is a decoder-only request."""

    decoder: SingletonInputs
    encoder: Optional[SingletonInputs] = None

    @property
    def is_encoder_decoder(self) -> bool:
        return self.encoder is not None

    @property
    def prompt(self) -> Optional[str]:
        return self.decoder.prompt

    @property
    def prompt_token_ids(self) -> List[int]:
        return list(self.decoder.prompt_token_ids)

    @property
    def encoder_prompt(self) -> Optional[str]:
        return self.encoder.prompt if self.encoder else None

    @property
    def encoder_prompt_token_ids(self) -> Optional[List[int]]:
        return list(self.encoder.prompt_token_ids) if self.encoder else None

    @property
    def multi_modal_data(self) -> Optional[Dict[str, Any]]:
        return self.encoder.multi_modal_data if self.encoder else self.decoder.multi_modal_data
