"""Per-step collection of what each processor does, as (row, token[, value]) arrays for LogitsProcessorBatch.

Rows come grouped by their SamplingParams object (the requests of one generate() call share one), so the Python
work on a request's id lists is done once per group and spread over its rows with numpy; histories are read with
array operations. Each function returns None when no row uses its processor.
"""
from __future__ import annotations

from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from seq2seq_engine.sampling.logits_processors.history import TokenHistories
from seq2seq_engine.sampling.logits_processors.matching import bad_words_bans, no_repeat_ngram_bans
from seq2seq_engine.sampling.metadata import identity_runs
from seq2seq_engine.sampling_params import SamplingParams

Pairs = Tuple[np.ndarray, np.ndarray]
Groups = List[Tuple[SamplingParams, np.ndarray]]


def _ids(values) -> np.ndarray:
    return np.asarray(values, dtype=np.int64)


def group_rows(params: Sequence[SamplingParams], rows: Sequence[int]) -> Groups:
    """The given rows grouped by SamplingParams object, as (params, row indices), in order of first row."""
    by_id: Dict[int, Tuple[SamplingParams, List[int]]] = {}
    rows = list(rows)
    for first, start, end in identity_runs([params[i] for i in rows]):   # a run of rows is added at once
        by_id.setdefault(id(first), (first, []))[1].extend(rows[start:end])
    return [(p, _ids(r)) for p, r in by_id.values()]


def active_groups(params: Sequence[SamplingParams], output_lens: np.ndarray,
                  always_processed: Callable[[SamplingParams], bool]) -> Groups:
    """`group_rows` of the rows with something to process: every row of a params object that `always_processed`
    accepts, else those with fewer than its min_tokens outputs. Each object is judged once, however many rows
    share it."""
    groups: Groups = []
    for p, rows in group_rows(params, range(len(params))):
        if not always_processed(p):
            if p.min_tokens <= 0:
                continue
            rows = rows[output_lens[rows] < p.min_tokens]
        if len(rows):
            groups.append((p, rows))
    return groups


def concat_pairs(*parts: Optional[Pairs]) -> Optional[Pairs]:
    parts = [p for p in parts if p is not None and len(p[0])]
    if not parts:
        return None
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


def _cross(rows: np.ndarray, tokens: Sequence[int]) -> Pairs:
    """Every (row, token) pair of rows x tokens."""
    tokens = _ids(tokens)
    return np.repeat(rows, len(tokens)), np.tile(tokens, len(rows))


def _history_pairs(histories: TokenHistories, rows: np.ndarray, outputs_only: bool) -> Pairs:
    """(row, token) for every token of each row's history, repeats included."""
    padded = histories.padded(rows, pad=-1, outputs_only=outputs_only)
    local, positions = np.nonzero(padded >= 0)
    return rows[local], padded[local, positions]


def _per_row(groups: Groups, num_rows: int, value) -> np.ndarray:
    out = np.zeros(num_rows, dtype=np.float64)
    for p, rows in groups:
        out[rows] = value(p)
    return out


def repetition(groups: Groups, histories: TokenHistories):
    groups = [(p, rows) for p, rows in groups if p.repetition_penalty != 1.0]
    if not groups:
        return None
    rows, tokens = _history_pairs(histories, np.concatenate([r for _, r in groups]), outputs_only=False)
    penalty = _per_row(groups, histories.num_rows, lambda p: p.repetition_penalty)
    return rows, tokens, penalty[rows]


def presence_frequency(groups: Groups, histories: TokenHistories):
    groups = [(p, rows) for p, rows in groups if p.presence_penalty != 0.0 or p.frequency_penalty != 0.0]
    if not groups:
        return None
    rows, tokens = _history_pairs(histories, np.concatenate([r for _, r in groups]), outputs_only=True)
    if not len(rows):
        return None
    presence = _per_row(groups, histories.num_rows, lambda p: p.presence_penalty)
    frequency = _per_row(groups, histories.num_rows, lambda p: p.frequency_penalty)
    return rows, tokens, presence[rows], frequency[rows]


def ngram_bans(groups: Groups, histories: TokenHistories) -> Optional[Pairs]:
    by_size: Dict[int, List[np.ndarray]] = {}
    for p, rows in groups:
        if p.no_repeat_ngram_size > 0:
            by_size.setdefault(p.no_repeat_ngram_size, []).append(rows)
    return concat_pairs(*[no_repeat_ngram_bans(histories, np.concatenate(rows), size)
                          for size, rows in by_size.items()])


def bad_word_bans(groups: Groups, histories: TokenHistories, eos_token_id: Optional[int]) -> Optional[Pairs]:
    # As HF, a bad word that is just EOS is dropped (min_tokens or suppress_tokens keep EOS out instead).
    group_words = [(rows, [w for w in p.all_bad_words_ids if w != [eos_token_id]]) for p, rows in groups
                   if p.bad_words_ids or p._bad_words_token_ids]
    return bad_words_bans(histories, group_words) if group_words else None


def min_tokens_bans(groups: Groups, output_lens: np.ndarray, eos_token_id: Optional[int]) -> Optional[Pairs]:
    """EOS (even with ignore_eos, as vLLM) and the stop_token_ids of rows with fewer than min_tokens outputs."""
    eos = [] if eos_token_id is None else [eos_token_id]
    return concat_pairs(*[_cross(rows[output_lens[rows] < p.min_tokens], p.stop_token_ids + eos)
                          for p, rows in groups if p.min_tokens > 0])


def forced(groups: Groups, histories: TokenHistories, max_model_len: Optional[int],
           eos_token_id: Optional[int]) -> Optional[Pairs]:
    """HF ForcedBOS (decoder length 1) and ForcedEOS (the next token is the last one allowed; it wins over BOS).
    A token the row's min_tokens ban covers is not forced."""
    parts = []
    for p, rows in groups:
        if p.forced_bos_token_id is None and p.forced_eos_token_id is None:
            continue
        seq_lens, output_lens = histories.seq_lens[rows], histories.output_lens[rows]
        tokens = np.full(len(rows), -1, dtype=np.int64)
        if p.forced_bos_token_id is not None:
            tokens[seq_lens == 1] = p.forced_bos_token_id
        if p.forced_eos_token_id is not None:
            last = np.zeros(len(rows), dtype=bool)
            if p.max_tokens is not None:
                last |= output_lens == p.max_tokens - 1
            if max_model_len is not None:
                last |= seq_lens == max_model_len - 1
            tokens[last] = p.forced_eos_token_id
        banned = _ids(p.stop_token_ids + ([] if eos_token_id is None else [eos_token_id]))
        keep = (tokens >= 0) & ~((output_lens < p.min_tokens) & np.isin(tokens, banned))
        parts.append((rows[keep], tokens[keep]))
    return concat_pairs(*parts)


def suppress_bans(groups: Groups, histories: TokenHistories) -> Optional[Pairs]:
    """suppress_tokens every step; begin_suppress_tokens at the first generated token. As HF, a decoder prompt of
    length 1 with a forced BOS moves the 'first' token one step later (the forced BOS comes first)."""
    parts = []
    for p, rows in groups:
        if p.suppress_tokens:
            parts.append(_cross(rows, p.suppress_tokens))
        if p.begin_suppress_tokens:
            begin = (histories.prompt_lens[rows] <= 1) & (p.forced_bos_token_id is not None)
            parts.append(_cross(rows[histories.output_lens[rows] == begin], p.begin_suppress_tokens))
    return concat_pairs(*parts)


def logit_bias(groups: Groups):
    parts, values = [], []
    for p, rows in groups:
        if p.logit_bias:
            parts.append(_cross(rows, list(p.logit_bias)))
            values.append(np.tile(np.array(list(p.logit_bias.values()), dtype=np.float64), len(rows)))
    pairs = concat_pairs(*parts)
    return None if pairs is None else (pairs[0], pairs[1], np.concatenate(values))


def allowed(groups: Groups):
    groups = [(p, rows) for p, rows in groups if p.allowed_token_ids is not None]
    if not groups:
        return None
    rows, tokens = concat_pairs(*[_cross(rows, p.allowed_token_ids) for p, rows in groups])
    return np.concatenate([r for _, r in groups]), rows, tokens
