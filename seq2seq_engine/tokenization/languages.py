"""Source and target languages of a translation request, the way each model family expects them.

* mBART, M2M100, NLLB: the tokenizer encodes the source with its ``src_lang`` code in front; the target language
  code starts the decoder (decoder prompt ``[decoder_start, tgt_code]``, which is what HF's
  ``forced_bos_token_id=tgt_code`` produces). Codes: ``fr_XX`` (mBART), ``fr`` (M2M100, token ``__fr__``),
  ``fra_Latn`` (NLLB).
* Marian: the source language is fixed by the model; a multi-target OPUS model reads the target from a ``>>xx<<``
  token at the start of the source, so ``tgt_lang="xx"`` prepends it (refused when the vocabulary lacks it).
* Pegasus: summarization only; any language is refused.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Iterable, Iterator, List, Optional

_MAX_LISTED = 8
_SRC, _TGT = "src_lang (--src-lang)", "tgt_lang (--tgt-lang)"
# Families whose tokenizer's extra special tokens are exactly its language codes: a code must be one of them (an
# NLLB "fr" may well be an ordinary vocabulary piece). Other tokenizers accept any token of the vocabulary.
_CODES_ARE_SPECIAL_TOKENS = frozenset({"mbart", "m2m_100"})


def _language_codes(tokenizer: Any) -> List[str]:
    """The language codes a tokenizer knows (M2M100: its lang_code_to_id; mBART/NLLB: extra special tokens)."""
    by_code = getattr(tokenizer, "lang_code_to_id", None)
    if by_code:
        return list(by_code)
    for attribute in ("extra_special_tokens", "additional_special_tokens"):
        try:
            tokens = getattr(tokenizer, attribute, None)
        except AttributeError:          # transformers raises it for unknown special-token attributes
            tokens = None
        if isinstance(tokens, (list, tuple)) and tokens:
            return [str(token) for token in tokens]
    return []


def _unknown(field: str, value: str, known: Iterable[str], what: str) -> ValueError:
    known = list(known)
    listed = ", ".join(known[:_MAX_LISTED]) + (", ..." if len(known) > _MAX_LISTED else "")
    hint = f"; valid codes include: {listed}" if known else f"; {what}"
    return ValueError(f"{field} {value!r} is not a language code of this tokenizer{hint}")


def _token_id(tokenizer: Any, token: str) -> Optional[int]:
    token_id = tokenizer.convert_tokens_to_ids(token)
    return None if token_id is None or token_id == tokenizer.unk_token_id else token_id


def _code_token_id(tokenizer: Any, field: str, code: str, family: str) -> int:
    """The id of a language code's token (M2M100 maps ``fr`` to ``__fr__``), else a ValueError naming `field`."""
    codes = _language_codes(tokenizer)
    if getattr(tokenizer, "lang_code_to_id", None) and hasattr(tokenizer, "get_lang_id"):
        if code not in codes:
            raise _unknown(field, code, codes, "")
        return tokenizer.get_lang_id(code)
    token_id = _token_id(tokenizer, code)
    if token_id is None or (family in _CODES_ARE_SPECIAL_TOKENS and codes and code not in codes):
        raise _unknown(field, code, codes, "the tokenizer lists no language codes")
    return token_id


@dataclasses.dataclass(frozen=True)
class TranslationLanguages:
    """What a translation request gets: ids put before the encoder prompt (Marian's ``>>xx<<``, as text and
    as id) and the decoder prompt (the target code), applied by `prompt()`."""

    encoder_prefix_text: Optional[str] = None
    encoder_prefix_id: Optional[int] = None
    decoder_prompt_ids: Optional[List[int]] = None

    def prompt(self, prompt: Any) -> Any:
        """One prompt (str, text/tokens dict, or explicit encoder/decoder dict) with the languages applied; an
        explicit prompt keeps its own decoder prompt."""
        if isinstance(prompt, dict) and "encoder_prompt" in prompt:
            return {**prompt, "encoder_prompt": self._encoder(prompt["encoder_prompt"])}
        encoder = self._encoder(prompt)
        if self.decoder_prompt_ids is None:
            return encoder
        return {"encoder_prompt": encoder, "decoder_prompt": {"prompt_token_ids": list(self.decoder_prompt_ids)}}

    def prompts(self, prompts: Iterable[Any]) -> Iterator[Any]:
        return (self.prompt(prompt) for prompt in prompts)

    def _encoder(self, prompt: Any) -> Any:
        if self.encoder_prefix_id is None:
            return prompt
        if isinstance(prompt, str):
            return f"{self.encoder_prefix_text} {prompt}"
        if isinstance(prompt, dict) and "prompt_token_ids" in prompt:
            return {**prompt, "prompt_token_ids": [self.encoder_prefix_id] + list(prompt["prompt_token_ids"])}
        if isinstance(prompt, dict) and "prompt" in prompt:
            return {**prompt, "prompt": f"{self.encoder_prefix_text} {prompt['prompt']}"}
        raise TypeError(f"cannot put the target language token before a prompt of type {type(prompt).__name__}")


def _family(model_type: Optional[str], tokenizer: Any) -> str:
    """The HF model type, else the one the tokenizer class names ("" when it names none of these)."""
    if model_type:
        return model_type
    name = type(tokenizer).__name__
    prefixes = (("Marian", "marian"), ("Pegasus", "pegasus"), ("MBart", "mbart"), ("M2M100", "m2m_100"),
                ("Nllb", "m2m_100"))
    return next((family for prefix, family in prefixes if name.startswith(prefix)), "")


def _marian_languages(tokenizer: Any, src_lang: Optional[str], tgt_lang: Optional[str]) -> TranslationLanguages:
    if src_lang is not None:
        raise ValueError(f"{_SRC} does not apply to Marian models: the source language is fixed by the model")
    if tgt_lang is None:
        return TranslationLanguages()
    token = tgt_lang if tgt_lang.startswith(">>") else f">>{tgt_lang}<<"
    token_id = _token_id(tokenizer, token)
    if token_id is None:
        known = [t for t in tokenizer.get_vocab() if t.startswith(">>") and t.endswith("<<")]
        raise _unknown(_TGT, tgt_lang, [t[2:-2] for t in known],
                       f"this Marian model has no {token} token: it translates into one fixed language")
    return TranslationLanguages(encoder_prefix_text=token, encoder_prefix_id=token_id)


def translation_languages(tokenizer: Any, src_lang: Optional[str] = None, tgt_lang: Optional[str] = None,
                          model_type: Optional[str] = None) -> TranslationLanguages:
    """Check the languages against the tokenizer and model family (HF ``model_type``; guessed from the tokenizer
    class when None), set the tokenizer's ``src_lang`` where it has one, and return how prompts carry them.
    ValueError names the field and lists some valid codes."""
    if src_lang is None and tgt_lang is None:
        return TranslationLanguages()
    if tokenizer is None:
        raise ValueError(f"{_SRC} and {_TGT} need a tokenizer (not skip_tokenizer_init)")
    family = _family(model_type, tokenizer)
    if family == "pegasus":
        raise ValueError(f"Pegasus models summarize; {_SRC} and {_TGT} do not apply")
    if family == "marian":
        return _marian_languages(tokenizer, src_lang, tgt_lang)
    if src_lang is not None:
        if not hasattr(tokenizer, "src_lang"):
            raise ValueError(f"{_SRC}: the tokenizer {type(tokenizer).__name__} has no source language")
        _code_token_id(tokenizer, _SRC, src_lang, family)
        tokenizer.src_lang = src_lang
    if tgt_lang is None:
        return TranslationLanguages()
    return TranslationLanguages(decoder_prompt_ids=[_code_token_id(tokenizer, _TGT, tgt_lang, family)])
