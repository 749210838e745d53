"""Persistent token-id and block tables of the running sequences, and a step's flat inputs computed from them."""
from __future__ import annotations

import dataclasses
from typing import Dict, Iterable, List, Optional, Sequence as Seq

import numpy as np

from seq2seq_engine.sequence import SequenceData


@dataclasses.dataclass
class FlatInputs:
    """A step's decoder inputs, one entry per scheduled token (or per request for the per-request arrays)."""

    positions: np.ndarray             # [num_tokens]
    token_indices: np.ndarray         # [num_tokens] flat index into the token-id table
    input_ids: np.ndarray             # [num_tokens]
    block_numbers: np.ndarray         # [num_tokens]
    slot_mapping: np.ndarray          # [num_tokens]
    query_start_loc: np.ndarray       # [num_reqs + 1]
    seq_lens: np.ndarray              # [num_reqs] computed + scheduled tokens
    num_tokens: int


def prepare_flat_inputs(rows: np.ndarray, num_computed_tokens: np.ndarray, num_scheduled_tokens: np.ndarray,
                        token_table: np.ndarray, block_table: np.ndarray, block_size: int) -> FlatInputs:
    """Everything per token, computed with array operations from the persistent tables (no per-token loop)."""
    max_model_len, max_blocks_per_req = token_table.shape[1], block_table.shape[1]
    query_start_loc = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum(num_scheduled_tokens, out=query_start_loc[1:])
    num_tokens = int(query_start_loc[-1])
    req_indices = np.repeat(rows, num_scheduled_tokens)
    # Offset of each token inside its request's scheduled chunk: 0, 1, ..., n_i - 1 for each request i.
    offsets = np.arange(num_tokens, dtype=np.int64) - np.repeat(query_start_loc[:-1], num_scheduled_tokens)
    positions = np.repeat(num_computed_tokens, num_scheduled_tokens) + offsets
    token_indices = positions + req_indices * max_model_len
    input_ids = token_table.reshape(-1)[token_indices]
    block_table_indices = req_indices * max_blocks_per_req + positions // block_size
    block_numbers = block_table.reshape(-1)[block_table_indices].astype(np.int64)
    slot_mapping = block_numbers * block_size + positions % block_size
    return FlatInputs(
        positions=positions, token_indices=token_indices, input_ids=input_ids, block_numbers=block_numbers,
        slot_mapping=slot_mapping, query_start_loc=query_start_loc,
        seq_lens=num_computed_tokens + num_scheduled_tokens, num_tokens=num_tokens)


class InputBatch:
    """Rows of token ids and block numbers, one row per live decoder sequence, kept across steps:
    each step only writes what changed (new tokens, new blocks)."""

    def __init__(self, max_num_seqs: int, max_model_len: int, block_size: int) -> None:
        self.max_model_len = max_model_len
        self.block_size = block_size
        self.max_blocks_per_seq = -(-max_model_len // block_size)
        self.token_ids = np.zeros((max_num_seqs, max_model_len), dtype=np.int64)
        self.block_table = np.zeros((max_num_seqs, self.max_blocks_per_seq), dtype=np.int32)
        self.prompt_lens = np.zeros(max_num_seqs, dtype=np.int64)
        # Per row: tokens written, and the block-number list written with how many of its entries (sync_decode
        # appends to a row only while that same list, which the block manager grows in place, is passed).
        self._num_synced_tokens: List[int] = [0] * max_num_seqs
        self._synced_tables: List[Optional[Seq[int]]] = [None] * max_num_seqs
        self._num_synced_blocks: List[int] = [0] * max_num_seqs
        self._row_of_seq: Dict[int, int] = {}
        self._free_rows: List[int] = list(reversed(range(max_num_seqs)))

    def _grow(self) -> None:
        capacity = self.token_ids.shape[0]
        self.token_ids = np.concatenate([self.token_ids, np.zeros_like(self.token_ids)])
        self.block_table = np.concatenate([self.block_table, np.zeros_like(self.block_table)])
        self.prompt_lens = np.concatenate([self.prompt_lens, np.zeros_like(self.prompt_lens)])
        self._num_synced_tokens += [0] * capacity
        self._synced_tables += [None] * capacity
        self._num_synced_blocks += [0] * capacity
        self._free_rows = list(reversed(range(capacity, 2 * capacity))) + self._free_rows

    def row_of(self, seq_id: int) -> int:
        row = self._row_of_seq.get(seq_id)
        if row is None:
            if not self._free_rows:
                self._grow()
            row = self._free_rows.pop()
            self._row_of_seq[seq_id] = row
            self._num_synced_tokens[row] = 0
            self._synced_tables[row] = None
        return row

    def sync(self, seq_id: int, seq_data: SequenceData, block_table: Seq[int]) -> int:
        """Write the sequence's tokens not yet in its row, and its current block table; returns the row."""
        row = self.row_of(seq_id)
        synced, total = self._num_synced_tokens[row], seq_data.get_len()
        if total > self.max_model_len:
            raise ValueError(f"sequence {seq_id} has {total} tokens, more than max_model_len={self.max_model_len}")
        if synced < total:
            prompt_len = seq_data.get_prompt_len()
            self.prompt_lens[row] = prompt_len
            if synced < prompt_len:
                self.token_ids[row, synced:prompt_len] = seq_data.prompt_token_ids[synced:]
                synced = prompt_len
            self.token_ids[row, synced:total] = seq_data.output_token_ids[synced - prompt_len:]
            self._num_synced_tokens[row] = total
        self.block_table[row, :len(block_table)] = block_table
        self._synced_tables[row] = block_table
        self._num_synced_blocks[row] = len(block_table)
        return row

    def sync_decode(self, seq_id: int, seq_data: SequenceData, block_table: Seq[int]) -> int:
        """`sync` of a sequence that gained at most one token since its last sync with this same (grown in place)
        block list: writes the new token, the new blocks and the last block (replaced by a copy-on-write)."""
        row = self._row_of_seq.get(seq_id)
        if row is None or self._synced_tables[row] is not block_table:
            return self.sync(seq_id, seq_data, block_table)
        synced, total = self._num_synced_tokens[row], seq_data.get_len()
        if total != synced:
            if total != synced + 1 or total > self.max_model_len:
                return self.sync(seq_id, seq_data, block_table)
            self.token_ids[row, synced] = seq_data.get_last_token_id()
            self._num_synced_tokens[row] = total
        num_blocks = len(block_table)
        num_synced_blocks = self._num_synced_blocks[row]
        if num_blocks != num_synced_blocks:
            self.block_table[row, num_synced_blocks:num_blocks] = block_table[num_synced_blocks:]
            self._num_synced_blocks[row] = num_blocks
        if num_blocks:
            self.block_table[row, num_blocks - 1] = block_table[-1]
        return row

    def write_tokens(self, seq_ids: Seq[int], positions: Seq[int], token_ids: Seq[int]) -> None:
        """Overwrite tokens at the given positions of live sequences' rows (a sequence without a row is skipped)."""
        row_of_seq = self._row_of_seq
        kept = [(row_of_seq[seq_id], position, token_id)
                for seq_id, position, token_id in zip(seq_ids, positions, token_ids) if seq_id in row_of_seq]
        if kept:
            rows, kept_positions, kept_tokens = zip(*kept)
            self.token_ids[list(rows), list(kept_positions)] = kept_tokens

    def sync_decode_rows(self, seq_ids: Seq[int], rows: np.ndarray, datas: Seq[SequenceData],
                         tables: Seq[Seq[int]]) -> None:
        """`sync_decode` of sequences that were synced into `rows` with these same block lists at the previous step,
        as array operations: each gained at most one token (else the row syncs alone) and blocks at the end."""
        lens = np.array([data.get_len() for data in datas], dtype=np.int64)
        synced = np.array([self._num_synced_tokens[row] for row in rows.tolist()], dtype=np.int64)
        grown = lens - synced
        if grown.min() < 0 or grown.max() > 1 or lens.max() > self.max_model_len:
            for seq_id, data, table in zip(seq_ids, datas, tables):
                self.sync_decode(seq_id, data, table)
            return
        new = np.flatnonzero(grown)
        if len(new):
            new_rows = rows[new]
            self.token_ids[new_rows, synced[new]] = [datas[i].get_last_token_id() for i in new.tolist()]
            for row, length in zip(new_rows.tolist(), lens[new].tolist()):
                self._num_synced_tokens[row] = length
        num_blocks = [len(table) for table in tables]
        for i, row in enumerate(rows.tolist()):
            synced_blocks = self._num_synced_blocks[row]
            if num_blocks[i] != synced_blocks:
                self.block_table[row, synced_blocks:num_blocks[i]] = tables[i][synced_blocks:]
                self._num_synced_blocks[row] = num_blocks[i]
        # the last block of each row again: a copy-on-write replaces it in place
        self.block_table[rows, np.asarray(num_blocks) - 1] = [table[-1] for table in tables]

    def release(self, seq_ids: Iterable[int]) -> None:
        for seq_id in seq_ids:
            row = self._row_of_seq.pop(seq_id, None)
            if row is not None:
                self._synced_tables[row] = None
                self._free_rows.append(row)

    @property
    def num_live_rows(self) -> int:
        return len(self._row_of_seq)
