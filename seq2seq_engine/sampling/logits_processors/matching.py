"""Vectorised matching of token histories: which tokens would repeat an n-gram or complete a bad word.

Both return (rows, tokens) pairs to ban, as int64 arrays. The work is array operations over every row's history
at once (a sliding window for n-grams, one comparison per prefix length for bad words), no loop over tokens.
"""
from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from seq2seq_engine.sampling.logits_processors.history import TokenHistories

Pairs = Tuple[np.ndarray, np.ndarray]
_EMPTY = np.zeros(0, dtype=np.int64)


def no_repeat_ngram_bans(histories: TokenHistories, rows: np.ndarray, ngram_size: int) -> Pairs:
    """HF `NoRepeatNGramLogitsProcessor` for `rows` (all with this n): a token is banned when the row's last n-1
    tokens followed by it form an n-gram that already occurs in the row's decoder prompt + outputs."""
    history = histories.padded(rows, pad=-1)
    num_starts = history.shape[1] - ngram_size + 1
    if num_starts <= 0:
        return _EMPTY, _EMPTY
    windows = sliding_window_view(history, ngram_size, axis=1)        # [G, num_starts, n]
    prefix, complete = histories.tails(rows, ngram_size - 1)          # [G, n-1]
    # A window is an n-gram of the history when it ends inside it; the window that starts at the prefix itself
    # would need the token being chosen now, so it is out.
    inside = np.arange(num_starts)[None, :] <= (histories.seq_lens[rows] - ngram_size)[:, None]
    matches = (windows[:, :, :-1] == prefix[:, None, :]).all(axis=-1) & inside & complete[:, None]
    local_rows, starts = np.nonzero(matches)
    return rows[local_rows], windows[local_rows, starts, -1]


def bad_words_bans(histories: TokenHistories, group_words: Sequence[Tuple[np.ndarray, List[List[int]]]]) -> Pairs:
    """HF `NoBadWordsLogitsProcessor`: the last token of a bad word is banned when the history ends with the rest
    of it (a one-token word: always). `group_words` holds (rows, bad word token sequences) per group of rows that
    share their bad words."""
    rows_out: List[np.ndarray] = []
    tokens_out: List[np.ndarray] = []
    for rows, words in group_words:
        singles = np.array([w[0] for w in words if len(w) == 1], dtype=np.int64)
        rows_out.append(np.repeat(rows, len(singles)))
        tokens_out.append(np.tile(singles, len(rows)))
        by_prefix_len: Dict[int, List[List[int]]] = {}
        for word in words:
            if len(word) > 1:
                by_prefix_len.setdefault(len(word) - 1, []).append(word)
        for prefix_len, same_len in by_prefix_len.items():
            word_arr = np.asarray(same_len, dtype=np.int64)                 # [W, prefix_len + 1]
            entry_rows = np.repeat(rows, len(word_arr))                    # every (row, word) entry
            entry_words = np.tile(word_arr, (len(rows), 1))
            tails, complete = histories.tails(entry_rows, prefix_len)
            matched = (tails == entry_words[:, :-1]).all(axis=1) & complete
            rows_out.append(entry_rows[matched])
            tokens_out.append(entry_words[matched, -1])
    return np.concatenate(rows_out), np.concatenate(tokens_out)
