"""Word error rate: case and punctuation normalised, word-level Levenshtein distance over reference words."""
from __future__ import annotations

import re
import unicodedata
from typing import Iterable, List, Tuple

_PUNCT = re.compile(r"[^\w\s']|_", re.UNICODE)


def normalize(text: str) -> List[str]:
    """Lower-cased words with punctuation removed ("Hello, world!" -> ["hello", "world"]).
    Numbers are not spelled out: "1, 2, 3" vs "one two three" counts as errors."""
    text = unicodedata.normalize("NFKC", text).lower()
    text = _PUNCT.sub(" ", text).replace("'", "")
    return text.split()


def edit_distance(reference: List[str], hypothesis: List[str]) -> int:
    """Word-level Levenshtein distance (substitutions + deletions + insertions)."""
    previous = list(range(len(hypothesis) + 1))
    for i, ref_word in enumerate(reference, 1):
        current = [i] + [0] * len(hypothesis)
        for j, hyp_word in enumerate(hypothesis, 1):
            current[j] = min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ref_word != hyp_word))
        previous = current
    return previous[-1]


def wer(reference: str, hypothesis: str) -> float:
    """WER of one pair (errors / reference words)."""
    ref = normalize(reference)
    return edit_distance(ref, normalize(hypothesis)) / max(len(ref), 1)


def corpus_wer(pairs: Iterable[Tuple[str, str]]) -> float:
    """Total errors / total reference words over (reference, hypothesis) pairs."""
    errors = words = 0
    for reference, hypothesis in pairs:
        ref = normalize(reference)
        errors += edit_distance(ref, normalize(hypothesis))
        words += len(ref)
    return errors / max(words, 1)
