"""Grouping a window's text tokens into timed words (openai-whisper's word and punctuation rules)."""
from __future__ import annotations

import dataclasses
import string
from typing import Callable, List, Sequence, Tuple

import numpy as np

PREPEND_PUNCTUATIONS = "\"'“¿([{-"
APPEND_PUNCTUATIONS = "\"'.。,，!！?？:：”)]}、"
SENTENCE_END_MARKS = ".。!！?？"
UNICODE_SPLIT_LANGUAGES = ("zh", "ja", "th", "lo", "my", "yue")

Decode = Callable[[List[int]], str]


@dataclasses.dataclass
class WordTiming:
    word: str
    tokens: List[int]
    start: float
    end: float
    probability: float


def split_on_unicode(token_ids: Sequence[int], decode: Decode) -> Tuple[List[str], List[List[int]]]:
    """Pieces of whole unicode: a token whose decoded text ends in a partial character joins the next."""
    full = decode(list(token_ids))
    replacement = "\ufffd"
    words: List[str] = []
    groups: List[List[int]] = []
    current: List[int] = []
    offset = 0
    for token in token_ids:
        current.append(int(token))
        decoded = decode(current)
        at = decoded.find(replacement)
        if at < 0 or (offset + at < len(full) and full[offset + at] == replacement):
            words.append(decoded)
            groups.append(current)
            current = []
            offset += len(decoded)
    return words, groups


def split_on_spaces(token_ids: Sequence[int], decode: Decode, eot: int) -> Tuple[List[str], List[List[int]]]:
    """Words of a space-delimited language: a new word at a leading space, punctuation or a special token."""
    words: List[str] = []
    groups: List[List[int]] = []
    for piece, piece_tokens in zip(*split_on_unicode(token_ids, decode)):
        special = piece_tokens[0] >= eot
        if special or piece.startswith(" ") or piece.strip() in string.punctuation or not words:
            words.append(piece)
            groups.append(list(piece_tokens))
        else:
            words[-1] += piece
            groups[-1].extend(piece_tokens)
    return words, groups


def split_to_word_tokens(token_ids: Sequence[int], decode: Decode, eot: int,
                         language: str) -> Tuple[List[str], List[List[int]]]:
    """(words, their token lists): whole-unicode pieces for zh/ja/th/lo/my/yue, else split_on_spaces."""
    if language in UNICODE_SPLIT_LANGUAGES:
        return split_on_unicode(token_ids, decode)
    return split_on_spaces(token_ids, decode, eot)


def merge_punctuations(words: List[WordTiming], prepended: str = PREPEND_PUNCTUATIONS,
                       appended: str = APPEND_PUNCTUATIONS) -> None:
    """In place: leading punctuation joins the next word, trailing punctuation the previous one (the emptied
    entries keep no text and no tokens)."""
    following_index = len(words) - 1
    for index in range(len(words) - 2, -1, -1):
        previous, following = words[index], words[following_index]
        if previous.word.startswith(" ") and previous.word.strip() in prepended:
            following.word = previous.word + following.word
            following.tokens = previous.tokens + following.tokens
            previous.word, previous.tokens = "", []
        else:
            following_index = index
    previous_index = 0
    for index in range(1, len(words)):
        previous, following = words[previous_index], words[index]
        if not previous.word.endswith(" ") and following.word in appended:
            previous.word = previous.word + following.word
            previous.tokens = previous.tokens + following.tokens
            following.word, following.tokens = "", []
        else:
            previous_index = index


def time_words(text_tokens: Sequence[int], token_probs: np.ndarray, start_frames: np.ndarray, decode: Decode,
               eot: int, language: str, frame_seconds: float) -> List[WordTiming]:
    """Words of `text_tokens` (without eot) with times from start_frames ([len(text_tokens) + 1]: one per token,
    then eot's) and mean token probabilities."""
    words, groups = split_to_word_tokens(list(text_tokens) + [eot], decode, eot, language)
    if len(groups) <= 1:
        return []
    boundaries = np.pad(np.cumsum([len(group) for group in groups[:-1]]), (1, 0))
    times = start_frames * frame_seconds
    return [WordTiming(word, group, float(times[begin]), float(times[end]),
                       float(np.mean(token_probs[begin:end])))
            for word, group, begin, end in zip(words[:-1], groups[:-1], boundaries[:-1], boundaries[1:])]


def truncate_long_words(words: List[WordTiming]) -> float:
    """openai's heuristic: a sentence-end mark, or the word after one, lasts at most twice the median word
    duration (capped at 0.7 s). Returns that median duration."""
    durations = np.array([w.end - w.start for w in words])
    durations = durations[durations.nonzero()]
    median = min(0.7, float(np.median(durations))) if len(durations) else 0.0
    if len(durations):
        longest = median * 2
        for index in range(1, len(words)):
            if words[index].end - words[index].start > longest:
                if words[index].word in SENTENCE_END_MARKS:
                    words[index].end = words[index].start + longest
                elif words[index - 1].word in SENTENCE_END_MARKS:
                    words[index].start = words[index].end - longest
    return median
