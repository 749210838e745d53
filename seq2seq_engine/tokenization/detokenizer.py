"""vLLM-style incremental detokenization.

`detokenize_incrementally` decodes one new token at a time. It keeps the token strings decoded so far and two
offsets: text is produced by decoding the window tokens[prefix_offset:] and subtracting the decode of
tokens[prefix_offset:read_offset], so tokenizers whose token strings depend on their neighbours (sentencepiece's
leading-space marker, byte-level BPE pieces of one UTF-8 character) come out right. While the window's text
ends in U+FFFD (an incomplete UTF-8 character) nothing is emitted and the offsets stay, so the character comes
out whole once its last byte arrives.
"""
from __future__ import annotations

import functools
from typing import Any, FrozenSet, List, Optional, Tuple

from seq2seq_engine.sampling_params import SamplingParams
from seq2seq_engine.sequence import Sequence

_REPLACEMENT_CHAR = "\ufffd"


# --------------------------------------------------------------------------- per-tokenizer facts, cached
class _TokenizerInfo:
    """Facts about a tokenizer that are slow to ask for on every token."""

    def __init__(self, tokenizer: Any) -> None:
        self.is_fast = bool(getattr(tokenizer, "is_fast", False))
        self.vocab_len = len(tokenizer)
        self.all_special_tokens: FrozenSet[str] = frozenset(getattr(tokenizer, "all_special_tokens", ()))
        added = tokenizer.get_added_vocab() if hasattr(tokenizer, "get_added_vocab") else {}
        self.added_vocab: FrozenSet[str] = frozenset(added)
        # transformers < 5 slow tokenizers decode added tokens apart from the text around them.
        self.split_added_tokens = (not self.is_fast and bool(self.added_vocab) and _transformers_major() < 5)


@functools.lru_cache(maxsize=None)
def _transformers_major() -> int:
    import transformers

    return int(transformers.__version__.split(".")[0])


_INFO_ATTR = "_seq2seq_engine_detok_info"


def _info(tokenizer: Any) -> _TokenizerInfo:
    info = getattr(tokenizer, _INFO_ATTR, None)
    if info is None:
        info = _TokenizerInfo(tokenizer)
        try:
            setattr(tokenizer, _INFO_ATTR, info)
        except AttributeError:
            pass
    return info


def _convert_tokens_to_string(tokenizer: Any, tokens: List[str], skip_special_tokens: bool,
                              spaces_between_special_tokens: bool = True) -> str:
    info = _info(tokenizer)
    if not info.split_added_tokens:
        return tokenizer.convert_tokens_to_string(tokens)
    # transformers 4.x slow-tokenizer decoding: added tokens are decoded on their own.
    sub_texts: List[str] = []
    current: List[str] = []
    for token in tokens:
        if skip_special_tokens and token in info.all_special_tokens:
            continue
        if token in info.added_vocab:
            if current:
                sub_texts.append(tokenizer.convert_tokens_to_string(current))
                current = []
            sub_texts.append(token)
        else:
            current.append(token)
    if current:
        sub_texts.append(tokenizer.convert_tokens_to_string(current))
    return (" " if spaces_between_special_tokens else "").join(sub_texts)


def _ids_to_tokens(tokenizer: Any, token_ids: List[int], skip_special_tokens: bool) -> List[str]:
    vocab_len = _info(tokenizer).vocab_len
    tokens: List[str] = []
    for token_id in token_ids:
        if 0 <= token_id < vocab_len:
            tokens.extend(tokenizer.convert_ids_to_tokens([token_id], skip_special_tokens=skip_special_tokens))
        else:
            tokens.append("")  # an id the model has but the tokenizer does not (padded vocabularies)
    return tokens


def detokenize_incrementally(tokenizer: Any, all_token_ids: List[int], prev_tokens: Optional[List[str]],
                             prefix_offset: int, read_offset: int, skip_special_tokens: bool = False,
                             spaces_between_special_tokens: bool = True
                             ) -> Tuple[List[str], str, int, int]:
    """Decode the last id of `all_token_ids` given the state left by the previous call.

    First call: prev_tokens=None, offsets 0; every id before the last is converted too and all their text is
    emitted with the new token's. Returns (new_tokens, new_text, prefix_offset, read_offset): new_tokens are to
    be appended to prev_tokens (on the first call they are all the tokens), new_text to the output text.
    """
    new_token_id = all_token_ids[-1]
    is_first_iter = prev_tokens is None
    if is_first_iter:
        prev_tokens = _ids_to_tokens(tokenizer, list(all_token_ids[:-1]), skip_special_tokens)
    new_tokens = _ids_to_tokens(tokenizer, [new_token_id], skip_special_tokens)
    output_tokens = prev_tokens + new_tokens
    if is_first_iter:
        new_tokens = output_tokens

    prefix_text = _convert_tokens_to_string(tokenizer, output_tokens[prefix_offset:read_offset], skip_special_tokens,
                                            spaces_between_special_tokens)
    new_text = _convert_tokens_to_string(tokenizer, output_tokens[prefix_offset:], skip_special_tokens,
                                         spaces_between_special_tokens)
    if len(new_text) <= len(prefix_text) or new_text.endswith(_REPLACEMENT_CHAR):
        # Nothing new yet, or an incomplete UTF-8 character at the end: wait for more tokens.
        return new_tokens, "", prefix_offset, read_offset
    return new_tokens, new_text[len(prefix_text):], read_offset, len(output_tokens)


class Detokenizer:
    """Appends each sequence's new output text as tokens arrive (the decoder prompt is not part of it)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        _info(tokenizer)

    def decode_sequence_inplace(self, seq: Sequence, params: SamplingParams) -> int:
        """Decode the sequence's last output token into seq.output_text; returns how many characters came.

        Call once per appended token. If tokens were appended without decoding before the first call, that
        first call decodes all of them.
        """
        output_ids = seq.data.output_token_ids
        if not output_ids:
            return 0
        new_tokens, new_text, prefix_offset, read_offset = detokenize_incrementally(
            self.tokenizer, output_ids, seq.tokens, seq.prefix_offset, seq.read_offset,
            skip_special_tokens=params.skip_special_tokens)
        if seq.tokens is None:
            seq.tokens = new_tokens
        else:
            seq.tokens.extend(new_tokens)
        seq.prefix_offset, seq.read_offset = prefix_offset, read_offset
        seq.output_text += new_text
        return len(new_text)
