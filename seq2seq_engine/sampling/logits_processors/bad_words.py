"""Text bad words to token sequences, with vLLM's rule: each word is tokenized as is and with a leading space
(a word is spelt differently at the start of a text and after a space); the spaced form is kept when it is a
different token sequence of the same length."""
from __future__ import annotations

from typing import Any, List, Sequence


def tokenize_bad_words(bad_words: Sequence[str], tokenizer: Any) -> List[List[int]]:
    token_ids: List[List[int]] = []
    for word in bad_words:
        plain = tokenizer.encode(word.lstrip(), add_special_tokens=False)
        spaced = tokenizer.encode(" " + word.lstrip(), add_special_tokens=False)
        if plain:
            token_ids.append(list(plain))
        if spaced and (not plain or (spaced[0] != plain[0] and len(spaced) == len(plain))):
            token_ids.append(list(spaced))
    return token_ids
