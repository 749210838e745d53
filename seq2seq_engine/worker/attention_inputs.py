"""A step's scheduled sequences as attention metadata on the host: self-attention slots, masks and decode tables,
and the encoder and cross-attention metadata of encoder/decoder requests."""
from __future__ import annotations

from typing import Optional, Sequence as Seq, Tuple

import numpy as np
import torch

from seq2seq_engine.attention.bias import (BlockDiagonalCausalFromBottomRightMask, BlockDiagonalCausalMask,
                                           BlockDiagonalMask)
from seq2seq_engine.attention.metadata import CrossAttentionMetadata, EncoderAttentionMetadata, SelfAttentionMetadata
from seq2seq_engine.worker.input_batch import FlatInputs
from seq2seq_engine.worker.scheduled_rows import Scheduled


def padded_table(tables: Seq[Seq[int]]) -> torch.Tensor:
    width = max(len(table) for table in tables)
    padded = np.zeros((len(tables), width), dtype=np.int32)
    for i, table in enumerate(tables):
        padded[i, :len(table)] = table
    return torch.from_numpy(padded)


def slots_of_prefixes(tables: Seq[Seq[int]], lengths: Seq[int], block_size: int) -> np.ndarray:
    """Slots of positions 0..length-1 of each table, concatenated (for writing whole encoder outputs)."""
    padded = padded_table(tables).numpy()
    lengths = np.asarray(lengths, dtype=np.int64)
    starts = np.repeat(np.cumsum(lengths) - lengths, lengths)
    positions = np.arange(int(lengths.sum()), dtype=np.int64) - starts
    rows = np.repeat(np.arange(len(tables)), lengths)
    return padded[rows, positions // block_size].astype(np.int64) * block_size + positions % block_size


def self_metadata(flat: FlatInputs, scheduled: Scheduled, block_table: np.ndarray,
                  block_size: int) -> SelfAttentionMetadata:
    """Decoder self-attention: slots of the new tokens, the prefill mask (and tables of a continued prefill), the
    decodes' context lengths and tables trimmed to the longest context."""
    num_prefills = scheduled.num_prefills
    query_lens = scheduled.num_scheduled[:num_prefills]
    seq_lens = flat.seq_lens[:num_prefills].tolist()
    prefill_bias, prefill_block_tables = None, None
    if num_prefills and any(scheduled.num_computed[:num_prefills]):
        prefill_bias = BlockDiagonalCausalFromBottomRightMask.from_seqlens(q_seqlen=query_lens, kv_seqlen=seq_lens)
        prefill_block_tables = torch.from_numpy(block_table[scheduled.rows[:num_prefills]])
    elif num_prefills:
        prefill_bias = BlockDiagonalCausalMask.from_seqlens(query_lens)
    decode_seq_lens, decode_block_tables, max_decode_len = None, None, 0
    if len(scheduled.rows) > num_prefills:
        decode_lens = flat.seq_lens[num_prefills:]
        max_decode_len = int(decode_lens.max())
        num_blocks = -(-max_decode_len // block_size)
        decode_block_tables = torch.from_numpy(block_table[scheduled.rows[num_prefills:], :num_blocks])
        decode_seq_lens = torch.from_numpy(decode_lens.astype(np.int32))
    return SelfAttentionMetadata(
        slot_mapping=torch.from_numpy(flat.slot_mapping), prefill_bias=prefill_bias,
        prefill_block_tables=prefill_block_tables, decode_seq_lens=decode_seq_lens,
        decode_block_tables=decode_block_tables, max_decode_seq_len=max_decode_len)


def encoder_and_cross_metadata(scheduled: Scheduled, block_size: int) -> Tuple[
        Optional[EncoderAttentionMetadata], Optional[CrossAttentionMetadata]]:
    """(encoder metadata of the prefills that run their encoder, cross metadata) of the encoder/decoder requests,
    or (None, None) when the step has none. Prefills whose cross table another request or an earlier step wrote
    read it back (prefill_block_tables), as do all the step's prefills then."""
    if not scheduled.cross_tables:
        return None, None
    num_prefills = scheduled.num_prefills
    encoder_lens = scheduled.encoder_lens[:num_prefills]
    encoder_md, prefill_bias, cross_slots, prefill_tables = None, None, None, None
    if num_prefills:
        runs = scheduled.runs_encoder
        run_lens = [length for length, run in zip(encoder_lens, runs) if run]
        if run_lens:
            encoder_md = EncoderAttentionMetadata(bias=BlockDiagonalMask.from_seqlens(run_lens))
            run_tables = [table for table, run in zip(scheduled.cross_tables, runs) if run]
            cross_slots = torch.from_numpy(slots_of_prefixes(run_tables, run_lens, block_size))
        if not all(runs):
            prefill_tables = padded_table(scheduled.cross_tables[:num_prefills])
        prefill_bias = BlockDiagonalMask.from_seqlens(q_seqlen=scheduled.num_scheduled[:num_prefills],
                                                      kv_seqlen=encoder_lens)
    decode_lens, decode_tables, max_len = None, None, 0
    if len(scheduled.cross_tables) > num_prefills:
        # a step of decodes only may reuse the previous step's lists, and then what they give (cross tables stand)
        cached = scheduled.derived.get("cross_decode") if not num_prefills else None
        if cached is None:
            lens = scheduled.encoder_lens[num_prefills:]
            cached = (torch.tensor(lens, dtype=torch.int32), padded_table(scheduled.cross_tables[num_prefills:]),
                      max(lens))
            if not num_prefills:
                scheduled.derived["cross_decode"] = cached
        decode_lens, decode_tables, max_len = cached
    cross_md = CrossAttentionMetadata(prefill_bias=prefill_bias, cross_slot_mapping=cross_slots,
                                      decode_encoder_lens=decode_lens, decode_block_tables=decode_tables,
                                      max_decode_encoder_len=max_len, prefill_block_tables=prefill_tables)
    return encoder_md, cross_md
