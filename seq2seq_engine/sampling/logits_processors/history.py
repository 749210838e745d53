"""The decoder token histories (decoder prompt + outputs) of the rows one step samples, read as padded arrays."""
from __future__ import annotations

import dataclasses
from typing import List, Sequence

import numpy as np


@dataclasses.dataclass
class TokenHistories:
    """Row i's decoder tokens are `table[table_rows[i], :seq_lens[i]]`, the first `prompt_lens[i]` of them its
    decoder prompt. `table` may be shared and hold stale ids past a row's length (the runner's persistent
    token table): every reader masks by `seq_lens`. `output_token_ids[i]` is row i's output list (the same ids;
    handed to user logits processors)."""

    table: np.ndarray                       # [*, W] int64
    table_rows: np.ndarray                  # [N] int64
    prompt_lens: np.ndarray                 # [N] int64
    seq_lens: np.ndarray                    # [N] int64
    output_token_ids: Sequence[List[int]]   # [N] lists

    @classmethod
    def from_lists(cls, prompt_token_ids: Sequence[Sequence[int]],
                   output_token_ids: Sequence[List[int]]) -> "TokenHistories":
        """Histories of explicit token lists (e.g. beam hypotheses), packed into a fresh table."""
        prompt_lens = np.array([len(p) for p in prompt_token_ids], dtype=np.int64)
        seq_lens = prompt_lens + np.array([len(o) for o in output_token_ids], dtype=np.int64)
        table = np.zeros((len(seq_lens), max(int(seq_lens.max(initial=0)), 1)), dtype=np.int64)
        for i, (prompt, output) in enumerate(zip(prompt_token_ids, output_token_ids)):
            table[i, :prompt_lens[i]] = prompt
            table[i, prompt_lens[i]:seq_lens[i]] = output
        return cls(table, np.arange(len(seq_lens), dtype=np.int64), prompt_lens, seq_lens, list(output_token_ids))

    @property
    def num_rows(self) -> int:
        return len(self.seq_lens)

    @property
    def output_lens(self) -> np.ndarray:
        return self.seq_lens - self.prompt_lens

    def padded(self, rows: np.ndarray, pad: int, outputs_only: bool = False) -> np.ndarray:
        """[len(rows), width] token ids of the given rows (prompt + outputs, or outputs only), `pad` past the end."""
        seq_lens = self.seq_lens[rows]
        start = int(self.prompt_lens[rows].min()) if outputs_only and len(rows) else 0
        width = max(int(seq_lens.max(initial=0)) - start, 0)
        ids = self.table[self.table_rows[rows], start:start + width]
        positions = np.arange(start, start + width)
        valid = positions[None, :] < seq_lens[:, None]
        if outputs_only:
            valid &= positions[None, :] >= self.prompt_lens[rows][:, None]
        return np.where(valid, ids, pad)

    def tails(self, rows: np.ndarray, length: int):
        """(ids [len(rows), length], complete [len(rows)]): each row's last `length` tokens; rows shorter than
        that are not complete (their ids are meaningless)."""
        seq_lens = self.seq_lens[rows]
        positions = seq_lens[:, None] - length + np.arange(length)[None, :]
        ids = self.table[self.table_rows[rows][:, None], np.clip(positions, 0, None)]
        return ids, seq_lens >= length


class OutputLists(Sequence):
    """The output token lists of some sequences, read only when asked for (by user logits processors)."""

    def __init__(self, seq_data: Sequence) -> None:
        self._seq_data = seq_data

    def __len__(self) -> int:
        return len(self._seq_data)

    def __getitem__(self, index):
        return self._seq_data[index].output_token_ids
