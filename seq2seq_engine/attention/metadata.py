"""Attention metadata of one step, grouped by attention type. The batch is flattened: prefill tokens first,
then one token per decoding sequence."""
from __future__ import annotations

import dataclasses
from typing import Optional

import torch

from seq2seq_engine.attention.bias import AttentionBias


@dataclasses.dataclass
class SelfAttentionMetadata:
    """Decoder self-attention: where new K/V go, the prefill mask, and what decode steps read."""

    slot_mapping: torch.Tensor                       # [num_tokens] int64, slot of each new decoder token
    prefill_bias: Optional[AttentionBias]            # causal block-diagonal over the prefill tokens
    prefill_block_tables: Optional[torch.Tensor]     # [num_prefills, max_blocks]; set only when a prefill
    #                                                  continues a cached context (chunked prefill)
    decode_seq_lens: Optional[torch.Tensor]          # [num_decodes] int32, context length incl. the new token
    decode_block_tables: Optional[torch.Tensor]      # [num_decodes, max_blocks] int32
    max_decode_seq_len: int = 0


@dataclasses.dataclass
class EncoderAttentionMetadata:
    """Encoder self-attention over the encoder tokens of this step's prefill requests."""

    bias: AttentionBias                              # non-causal block-diagonal over encoder tokens


@dataclasses.dataclass
class CrossAttentionMetadata:
    """Decoder-to-encoder attention: prefills attend to fresh encoder K/V (and write them to cross blocks), or,
    when some prefill's encoder output is already cached, all read their cross blocks; decodes read cross blocks."""

    prefill_bias: Optional[AttentionBias]            # rectangular block-diagonal: decoder q × encoder kv
    cross_slot_mapping: Optional[torch.Tensor]       # [tokens of the encoders this step runs] int64
    decode_encoder_lens: Optional[torch.Tensor]      # [num_decodes] int32
    decode_block_tables: Optional[torch.Tensor]      # [num_decodes, max_blocks] int32
    max_decode_encoder_len: int = 0
    prefill_block_tables: Optional[torch.Tensor] = None   # [num_prefills, max_blocks] int32: prefills read the
    #                                                       cache (set when a prefill's encoder does not run)


@dataclasses.dataclass
class AttentionMetadata:
    num_prefills: int
    num_prefill_tokens: int
    num_decode_tokens: int
    self_attn: SelfAttentionMetadata
    encoder: Optional[EncoderAttentionMetadata] = None
    cross: Optional[CrossAttentionMetadata] = None

    @property
    def num_tokens(self) -> int:
        return self.num_prefill_tokens + self.num_decode_tokens
