"""LocalAgreement-2: of consecutive hypotheses of a growing turn, only the words the last two agree on are emitted,
and what was emitted is never taken back."""
from __future__ import annotations

import re
from typing import List, Optional, Sequence

_NOT_A_LETTER = re.compile(r"[^\w']+")


def _plain(word: str) -> str:
    return _NOT_A_LETTER.sub("", word.lower())


def common_prefix(first: Sequence[str], second: Sequence[str]) -> List[str]:
    """The longest common prefix of two word lists."""
    out = []
    for a, b in zip(first, second):
        if a != b:
            break
        out.append(a)
    return out


class LocalAgreement:
    """The agreed words of one turn: `insert` takes each new hypothesis (its words, in order) and returns the words
    newly agreed, the part of the common prefix of it and the hypothesis before it that lies beyond what was already
    emitted. A hypothesis that changes an emitted word emits nothing until later ones extend the emitted words
    again: the emitted words stay as they are."""

    def __init__(self) -> None:
        self.emitted: List[str] = []
        self._previous: Optional[List[str]] = None

    def insert(self, words: Sequence[str]) -> List[str]:
        words = list(words)
        previous, self._previous = self._previous, words
        if previous is None:
            return []
        return self._extend(common_prefix(previous, words))

    def confirm(self, words: Sequence[str]) -> List[str]:
        """Words known to be final (a finished decode of the turn's audio): the ones beyond the emitted words, when
        the emitted words are their prefix (none otherwise)."""
        words = list(words)
        self._previous = words
        return self._extend(words)

    def _extend(self, agreed: List[str]) -> List[str]:
        done = len(self.emitted)
        if len(agreed) <= done or agreed[:done] != self.emitted:
            return []
        new = agreed[done:]
        self.emitted.extend(new)
        return new

    def delta_text(self, new: Sequence[str]) -> str:
        """The text of words `new` just returned by insert/confirm, as it continues the text emitted before them:
        a leading space unless they are the first words."""
        if not new:
            return ""
        return ("" if len(self.emitted) == len(new) else " ") + " ".join(new)

    def holds(self) -> bool:
        """Whether the latest hypothesis still starts with the emitted words, up to case and punctuation (a decode
        forced to start with them then says the same words)."""
        if self._previous is None or len(self._previous) < len(self.emitted):
            return False
        return all(_plain(a) == _plain(b) for a, b in zip(self._previous, self.emitted))

    @property
    def text(self) -> str:
        return " ".join(self.emitted)
