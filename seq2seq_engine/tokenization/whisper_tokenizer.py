"""A Whisper tokenizer on the `tokenizers` library alone (no transformers import): what the engine asks of
transformers' WhisperTokenizer, for a directory whose tokenizer.json holds the vocabulary."""
from __future__ import annotations

import json
import os
import re
from typing import Any, Dict, Iterable, List, Optional, Sequence, Union

TOKENIZER_CLASSES = ("WhisperTokenizer", "WhisperTokenizerFast")
_NAMED_SPECIAL = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
# Settings transformers' class reads that this one does not follow: a directory with one of them set goes there.
_UNFOLLOWED = ("language", "task", "predict_timestamps", "normalizer_file")
_TIMESTAMP = re.compile(r"<\|(\d+\.\d+)\|>")
PROMPT, START = "<|startofprev|>", "<|startoftranscript|>"
NO_TIMESTAMPS = "<|notimestamps|>"


def _token_text(value: Any) -> Optional[str]:
    return value.get("content") if isinstance(value, dict) else value


def read_tokenizer_config(model_dir: str) -> Optional[Dict[str, Any]]:
    """tokenizer_config.json when it names a Whisper tokenizer this class follows and tokenizer.json exists."""
    path = os.path.join(model_dir, "tokenizer_config.json")
    if not (os.path.isfile(path) and os.path.isfile(os.path.join(model_dir, "tokenizer.json"))):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict) or config.get("tokenizer_class") not in TOKENIZER_CLASSES:
        return None
    if config.get("clean_up_tokenization_spaces") or any(config.get(key) for key in _UNFOLLOWED):
        return None
    return config


class WhisperJsonTokenizer:
    """transformers' Whisper tokenizer, as far as the engine uses it: encode (the <|startoftranscript|>
    <|notimestamps|> prefix and <|endoftext|> with special tokens), decode (prompt stripped when special tokens
    are skipped, timestamp tokens dropped from the text), token/id conversions, the vocabulary and special ids."""

    is_fast = True

    def __init__(self, model_dir: str, config: Dict[str, Any]) -> None:
        from tokenizers import Tokenizer, decoders, pre_tokenizers

        self.name_or_path = model_dir
        self._tokenizer = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
        self._tokenizer.normalizer = None
        self._tokenizer.post_processor = None
        self._tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=bool(config.get("add_prefix_space")))
        self._tokenizer.decoder = decoders.ByteLevel()
        self.model_max_length = int(config.get("model_max_length", 448))
        named = {key: _token_text(config.get(key)) for key in _NAMED_SPECIAL}
        for key, token in named.items():
            setattr(self, key, token)
            setattr(self, key + "_id", self._id_or_none(token))
        extra = config.get("additional_special_tokens") or config.get("extra_special_tokens")  # transformers 4 / 5
        listed = [_token_text(token) for token in extra] if isinstance(extra, list) else []
        flagged = [token.content for token in self._tokenizer.get_added_tokens_decoder().values() if token.special]
        self.all_special_tokens = list(dict.fromkeys(t for t in [*named.values(), *listed, *flagged] if t))
        self.all_special_ids = [self._tokenizer.token_to_id(t) for t in self.all_special_tokens]
        self._special_ids = frozenset(self.all_special_ids)
        self._prompt_id, self._start_id = self._tokenizer.token_to_id(PROMPT), self._tokenizer.token_to_id(START)
        self._prefix = [self._start_id, self._tokenizer.token_to_id(NO_TIMESTAMPS)]

    def _id_or_none(self, token: Optional[str]) -> Optional[int]:
        return None if token is None else self._tokenizer.token_to_id(token)

    def __len__(self) -> int:
        return self._tokenizer.get_vocab_size(with_added_tokens=True)

    def get_vocab(self) -> Dict[str, int]:
        return self._tokenizer.get_vocab(with_added_tokens=True)

    def get_added_vocab(self) -> Dict[str, int]:
        added = self._tokenizer.get_added_tokens_decoder()
        return {added[index].content: index for index in sorted(added)}

    def encode(self, text: str, add_special_tokens: bool = True) -> List[int]:
        ids = self._tokenizer.encode(text, add_special_tokens=False).ids
        return [*self._prefix, *ids, self.eos_token_id] if add_special_tokens else ids

    def decode(self, token_ids: Union[int, Iterable[int]], skip_special_tokens: bool = False) -> str:
        ids = [int(token_ids)] if isinstance(token_ids, int) else [int(i) for i in _as_list(token_ids)]
        if skip_special_tokens:
            ids = [i for i in self._strip_prompt(ids) if i not in self._special_ids]
        return _TIMESTAMP.sub("", self._tokenizer.decode(ids, skip_special_tokens=False))

    def _strip_prompt(self, ids: List[int]) -> List[int]:
        if not ids or ids[0] != self._prompt_id:
            return ids
        return ids[ids.index(self._start_id):] if self._start_id in ids else []

    def convert_ids_to_tokens(self, ids: Union[int, Sequence[int]], skip_special_tokens: bool = False):
        if isinstance(ids, int):
            return self._tokenizer.id_to_token(ids)
        return [self._tokenizer.id_to_token(int(i)) for i in ids
                if not (skip_special_tokens and int(i) in self._special_ids)]

    def convert_tokens_to_ids(self, tokens: Union[str, Sequence[str]]):
        if isinstance(tokens, str):
            return self._token_id(tokens)
        return [self._token_id(token) for token in tokens]

    def _token_id(self, token: str) -> Optional[int]:
        index = self._tokenizer.token_to_id(token)
        return self.unk_token_id if index is None else index

    def convert_tokens_to_string(self, tokens: List[str]) -> str:
        return self._tokenizer.decoder.decode(tokens)


def _as_list(token_ids: Any) -> List[int]:
    if hasattr(token_ids, "tolist"):
        return token_ids.tolist()
    return list(token_ids)


def load_whisper_tokenizer(model_dir: str) -> Optional[WhisperJsonTokenizer]:
    """The directory's Whisper tokenizer without transformers, or None when transformers' class is needed."""
    config = read_tokenizer_config(model_dir)
    return None if config is None else WhisperJsonTokenizer(model_dir, config)
