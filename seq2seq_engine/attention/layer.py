"""The Attention layer models use: fixed attention type and head geometry, dispatching to a backend."""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from seq2seq_engine.attention.backends import select_backend
from seq2seq_engine.attention.backends.torch_backend import KVCache, PositionBias, TorchAttentionBackend
from seq2seq_engine.attention.metadata import AttentionMetadata
from seq2seq_engine.attention.types import AttentionType


class Attention(nn.Module):
    """Multi-head (or grouped-query) attention over a flattened batch.

    query is [num_q_tokens, num_heads * head_size]; key/value are [num_kv_tokens, num_kv_heads * head_size].
    For ENCODER_DECODER layers key/value are the encoder output's projections of this step's prefill
    requests, or None when the step has no prefill (decodes read the cross blocks).
    ``position_bias`` (ENCODER and DECODER layers; T5's relative position bias) maps relative positions (key minus
    query) to an additive per-head bias; the backend computes the positions of each prefill block and decode row. A
    ``StepPositionBias`` in its place hands every layer of a forward pass the masks and decode bias it built once.
    """

    def __init__(self, num_heads: int, head_size: int, scale: float, num_kv_heads: Optional[int] = None,
                 attn_type: AttentionType = AttentionType.DECODER,
                 backend: Optional[TorchAttentionBackend] = None) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.head_size = head_size
        self.scale = scale
        self.num_kv_heads = num_kv_heads or num_heads
        if num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})")
        self.attn_type = attn_type
        self.backend = backend
        self.compute_dtype: Optional[torch.dtype] = None  # set by compute_encoder_attention_in

    def forward(self, query: torch.Tensor, key: Optional[torch.Tensor], value: Optional[torch.Tensor],
                kv_cache: Optional[KVCache], attn_metadata: AttentionMetadata,
                position_bias: Optional[PositionBias] = None) -> torch.Tensor:
        backend = self.backend or select_backend(query.device)
        query, key, value = self._split_heads(query, key, value)
        dtype = query.dtype
        if self.compute_dtype not in (None, dtype) and position_bias is None:  # an encoder's: keys are this step's
            query, key, value = (t.to(self.compute_dtype) for t in (query, key, value))
        output = backend.forward(self.attn_type, query, key, value, kv_cache, attn_metadata, self.scale,
                                 position_bias=position_bias)
        return output.to(dtype).view(-1, self.num_heads * self.head_size)

    def attend_cached(self, query: torch.Tensor, key: Optional[torch.Tensor], value: Optional[torch.Tensor],
                      kv_cache: Optional[KVCache], attn_metadata: AttentionMetadata) -> torch.Tensor:
        """ENCODER_DECODER attention over cross blocks the model wrote itself (T5's encoder states, written once
        for every layer): like forward, without writing ``key``/``value`` into ``kv_cache``."""
        if self.attn_type != AttentionType.ENCODER_DECODER:
            raise ValueError(f"attend_cached is for ENCODER_DECODER layers, not {self.attn_type}")
        backend = self.backend or select_backend(query.device)
        output = backend.cached_cross(*self._split_heads(query, key, value), kv_cache, attn_metadata, self.scale)
        return output.view(-1, self.num_heads * self.head_size)

    def _split_heads(self, query, key, value):
        """query as [tokens, num_heads, head_size]; key/value (when given) as [tokens, num_kv_heads, head_size]."""
        query = query.view(-1, self.num_heads, self.head_size)
        if key is not None:
            key = key.view(-1, self.num_kv_heads, self.head_size)
            value = value.view(-1, self.num_kv_heads, self.head_size)
        return query, key, value


def compute_encoder_attention_in(model: nn.Module, dtype: torch.dtype) -> int:
    """Let every ENCODER self-attention layer of `model` compute in `dtype` (its inputs cast, its output cast back;
    layers with a position bias keep their own dtype); returns how many layers were set."""
    layers = [m for m in model.modules() if isinstance(m, Attention) and m.attn_type == AttentionType.ENCODER]
    for layer in layers:
        layer.compute_dtype = dtype
    return len(layers)
