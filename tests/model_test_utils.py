"""Hand-built attention metadata and paged KV caches for driving models directly in tests (no scheduler/runner).

Block tables are lists of physical block ids per sequence (see `random_block_tables`). Sequences in a batch are
ordered prefills first, then decodes, exactly as the flattened token batch is.

Decoder-only:
    caches = make_kv_caches(num_layers, num_blocks, block_size, num_kv_heads, head_size)
    tables = random_block_tables([max_len] * 3, block_size, num_blocks, seed=0)
    md = prefill_metadata(prompt_lens, block_size, tables)              # whole prompts
    md = decode_metadata(seq_lens_incl_new_token, tables, block_size)   # one new token per sequence
    md = build_metadata(block_size, prefill_seq_lens=..., prefill_block_tables=..., prefill_context_lens=...,
                        decode_seq_lens=..., decode_block_tables=...)  # mixed / chunked-prefill steps
Encoder/decoder: pass `encoder_lens` (+ `cross_block_tables`) for the prefills and `decode_encoder_lens`
(+ `decode_cross_block_tables`) for the decodes; prefill steps then also carry encoder and cross metadata.
"""
from __future__ import annotations

import random
from typing import List, Optional, Sequence, Tuple

import torch

from seq2seq_engine.attention import (AttentionMetadata, CrossAttentionMetadata, EncoderAttentionMetadata,
                                      SelfAttentionMetadata)
from seq2seq_engine.attention.bias import (BlockDiagonalCausalFromBottomRightMask, BlockDiagonalCausalMask,
                                           BlockDiagonalMask)

BlockTable = Sequence[int]


def make_kv_caches(num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int, head_size: int,
                   dtype: torch.dtype = torch.float32, device="cpu", fill: str = "zeros",
                   seed: int = 0) -> List[Tuple[torch.Tensor, torch.Tensor]]:
    """One (key_cache, value_cache) per layer, each [num_blocks, block_size, num_kv_heads, head_size].
    fill="random" puts finite garbage in unwritten slots (catches reads outside a sequence's context)."""
    shape = (num_blocks, block_size, num_kv_heads, head_size)
    generator = torch.Generator().manual_seed(seed)
    caches = []
    for _ in range(num_layers):
        pair = []
        for _ in range(2):
            if fill == "random":
                pair.append(torch.randn(shape, generator=generator).to(device=device, dtype=dtype))
            else:
                pair.append(torch.zeros(shape, dtype=dtype, device=device))
        caches.append(tuple(pair))
    return caches


def blocks_needed(num_tokens: int, block_size: int) -> int:
    return (num_tokens + block_size - 1) // block_size


def random_block_tables(max_lens: Sequence[int], block_size: int, num_blocks: int, seed: int = 0) -> List[List[int]]:
    """Disjoint, randomly chosen (and randomly ordered) physical blocks for sequences of up to `max_lens` tokens."""
    needed = [blocks_needed(n, block_size) for n in max_lens]
    if sum(needed) > num_blocks:
        raise ValueError(f"{sum(needed)} blocks needed, cache has {num_blocks}")
    ids = list(range(num_blocks))
    random.Random(seed).shuffle(ids)
    tables, start = [], 0
    for n in needed:
        tables.append(ids[start:start + n])
        start += n
    return tables


def slots(block_table: BlockTable, start: int, end: int, block_size: int) -> List[int]:
    """Cache slots of token positions [start, end) of a sequence."""
    return [block_table[pos // block_size] * block_size + pos % block_size for pos in range(start, end)]


def padded_table(tables: Sequence[BlockTable], device="cpu") -> torch.Tensor:
    """[len(tables), max_blocks] int32, rows padded with 0."""
    width = max((len(t) for t in tables), default=0) or 1
    out = torch.zeros((len(tables), width), dtype=torch.int32)
    for row, table in enumerate(tables):
        out[row, :len(table)] = torch.tensor(list(table), dtype=torch.int32)
    return out.to(device)


def build_metadata(block_size: int, *, prefill_seq_lens: Sequence[int] = (),
                   prefill_block_tables: Sequence[BlockTable] = (),
                   prefill_context_lens: Optional[Sequence[int]] = None,
                   decode_seq_lens: Sequence[int] = (), decode_block_tables: Sequence[BlockTable] = (),
                   encoder_lens: Optional[Sequence[int]] = None,
                   cross_block_tables: Optional[Sequence[BlockTable]] = None,
                   decode_encoder_lens: Optional[Sequence[int]] = None,
                   decode_cross_block_tables: Optional[Sequence[BlockTable]] = None,
                   device="cpu") -> AttentionMetadata:
    """Metadata of one step: prefills (sequence i computes positions [prefill_context_lens[i], prefill_seq_lens[i])
    and writes them to its blocks) followed by decodes (each computes position decode_seq_lens[j] - 1).

    Encoder/decoder: `encoder_lens[i]` encoder tokens for prefill i (encoder + cross prefill metadata; cross K/V
    written to `cross_block_tables[i]` when given); decodes read `decode_encoder_lens[j]` cross entries from
    `decode_cross_block_tables[j]`.
    """
    num_prefills = len(prefill_seq_lens)
    context = list(prefill_context_lens) if prefill_context_lens is not None else [0] * num_prefills
    query_lens = [s - c for s, c in zip(prefill_seq_lens, context)]
    slot_list: List[int] = []
    for seq_len, ctx, table in zip(prefill_seq_lens, context, prefill_block_tables):
        slot_list += slots(table, ctx, seq_len, block_size)
    for seq_len, table in zip(decode_seq_lens, decode_block_tables):
        slot_list += slots(table, seq_len - 1, seq_len, block_size)

    prefill_bias = None
    chunked = any(context)
    if num_prefills:
        if chunked:
            prefill_bias = BlockDiagonalCausalFromBottomRightMask.from_seqlens(query_lens, list(prefill_seq_lens))
        else:
            prefill_bias = BlockDiagonalCausalMask.from_seqlens(list(prefill_seq_lens))
    num_decodes = len(decode_seq_lens)
    self_attn = SelfAttentionMetadata(
        slot_mapping=torch.tensor(slot_list, dtype=torch.int64, device=device),
        prefill_bias=prefill_bias,
        prefill_block_tables=padded_table(prefill_block_tables, device) if chunked else None,
        decode_seq_lens=torch.tensor(list(decode_seq_lens), dtype=torch.int32, device=device) if num_decodes
        else None,
        decode_block_tables=padded_table(decode_block_tables, device) if num_decodes else None,
        max_decode_seq_len=max(decode_seq_lens, default=0))

    encoder = cross = None
    if encoder_lens is not None or decode_encoder_lens is not None:
        cross_prefill_bias = cross_slot_mapping = None
        if num_prefills:
            encoder = EncoderAttentionMetadata(bias=BlockDiagonalMask.from_seqlens(list(encoder_lens)))
            cross_prefill_bias = BlockDiagonalMask.from_seqlens(query_lens, list(encoder_lens))
            if cross_block_tables is not None:
                cross_slots: List[int] = []
                for enc_len, table in zip(encoder_lens, cross_block_tables):
                    cross_slots += slots(table, 0, enc_len, block_size)
                cross_slot_mapping = torch.tensor(cross_slots, dtype=torch.int64, device=device)
        dec_enc = list(decode_encoder_lens or ())
        cross = CrossAttentionMetadata(
            prefill_bias=cross_prefill_bias, cross_slot_mapping=cross_slot_mapping,
            decode_encoder_lens=torch.tensor(dec_enc, dtype=torch.int32, device=device) if num_decodes else None,
            decode_block_tables=padded_table(decode_cross_block_tables, device) if num_decodes else None,
            max_decode_encoder_len=max(dec_enc, default=0))

    return AttentionMetadata(num_prefills=num_prefills, num_prefill_tokens=sum(query_lens),
                             num_decode_tokens=num_decodes, self_attn=self_attn, encoder=encoder, cross=cross)


def prefill_metadata(seq_lens: Sequence[int], block_size: int, block_tables: Sequence[BlockTable],
                     context_lens: Optional[Sequence[int]] = None, encoder_lens: Optional[Sequence[int]] = None,
                     cross_block_tables: Optional[Sequence[BlockTable]] = None, device="cpu") -> AttentionMetadata:
    """A prefill-only step over whole prompts (or, with `context_lens`, prompt chunks after a cached context)."""
    return build_metadata(block_size, prefill_seq_lens=seq_lens, prefill_block_tables=block_tables,
                          prefill_context_lens=context_lens, encoder_lens=encoder_lens,
                          cross_block_tables=cross_block_tables, device=device)


def decode_metadata(seq_lens: Sequence[int], block_tables: Sequence[BlockTable], block_size: int,
                    encoder_lens: Optional[Sequence[int]] = None,
                    cross_block_tables: Optional[Sequence[BlockTable]] = None, device="cpu") -> AttentionMetadata:
    """A decode-only step: one new token per sequence; `seq_lens` include that token."""
    return build_metadata(block_size, decode_seq_lens=seq_lens, decode_block_tables=block_tables,
                          decode_encoder_lens=encoder_lens, decode_cross_block_tables=cross_block_tables,
                          device=device)


def flat_prefill_inputs(prompts: Sequence[Sequence[int]], context_lens: Optional[Sequence[int]] = None,
                        device="cpu") -> Tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, positions) of prefills flattened into one batch (tokens from each context_len on)."""
    context = context_lens or [0] * len(prompts)
    ids = [t for prompt, c in zip(prompts, context) for t in prompt[c:]]
    positions = [p for prompt, c in zip(prompts, context) for p in range(c, len(prompt))]
    return (torch.tensor(ids, dtype=torch.int64, device=device),
            torch.tensor(positions, dtype=torch.int64, device=device))


def last_token_indices(query_lens: Sequence[int]) -> torch.Tensor:
    """Index of each sequence's last token in the flattened batch."""
    return torch.tensor(list(query_lens), dtype=torch.int64).cumsum(0) - 1
