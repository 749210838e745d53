"""T5 layers (T5 / mT5 / Flan-T5 / UMT5): RMS layer norm, attention with the relative position bias and without
score scaling, ReLU or gated feed-forward. Module and attribute names mirror HF transformers' checkpoint names;
q/k/v (self) and k/v (cross) projections are fused as in encoder_decoder_utils."""
from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import nn

from seq2seq_engine.attention import Attention, AttentionMetadata, AttentionType
from seq2seq_engine.attention.position_bias import StepPositionBias
from seq2seq_engine.kernels import native_fused as fused_ops
from seq2seq_engine.kernels.relative_buckets import relative_position_bucket
from seq2seq_engine.models.encoder_decoder_utils import FusedLinear, KVCache
from seq2seq_engine.models.utils import get_activation


class T5LayerNorm(nn.Module):
    """Scale-only RMS norm (no mean subtraction, no bias), accumulated in float32 and cast back to the weight's
    dtype, as HF's T5LayerNorm, fused with the residual add before it (kernels/native_fused.py)."""

    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, hidden_states: torch.Tensor,
                residual: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
        """(normed, hidden_states + residual), or (normed, hidden_states) without a residual."""
        normed, summed = fused_ops.rms_norm(hidden_states, self.weight, self.eps, residual)
        return normed, hidden_states if summed is None else summed


class T5SelfAttention(nn.Module):
    """Encoder (bidirectional) or decoder (causal) self-attention: fused q/k/v, unscaled scores plus the relative
    position bias handed to forward. With ``has_bias`` the layer owns the bias table (``relative_attention_bias``,
    [num_buckets, num_heads]) and its ``position_bias`` maps relative positions to [num_heads, *shape]."""

    def __init__(self, hf_config, attn_type: AttentionType, has_bias: bool) -> None:
        super().__init__()
        self.num_heads, self.d_kv = hf_config.num_heads, hf_config.d_kv
        self.inner_dim = self.num_heads * self.d_kv
        self.qkv = FusedLinear(hf_config.d_model, self.inner_dim, ("q", "k", "v"), bias=False)
        self.o = nn.Linear(self.inner_dim, hf_config.d_model, bias=False)
        self.attn = Attention(self.num_heads, self.d_kv, 1.0, attn_type=attn_type)
        self.bidirectional = attn_type == AttentionType.ENCODER
        self.num_buckets = hf_config.relative_attention_num_buckets
        self.max_distance = hf_config.relative_attention_max_distance
        self.relative_attention_bias = nn.Embedding(self.num_buckets, self.num_heads) if has_bias else None

    def buckets(self, relative: torch.Tensor) -> torch.Tensor:
        return relative_position_bucket(relative, self.bidirectional, self.num_buckets, self.max_distance)

    def lookup(self, buckets: torch.Tensor) -> torch.Tensor:
        """The bias [num_heads, *shape] of bucket indices of any shape."""
        return self.relative_attention_bias.weight.t()[:, buckets]

    def position_bias(self, relative: torch.Tensor) -> torch.Tensor:
        return self.lookup(self.buckets(relative))

    def forward(self, hidden_states: torch.Tensor, kv_cache: Optional[KVCache], attn_metadata: AttentionMetadata,
                position_bias: StepPositionBias) -> torch.Tensor:
        q, k, v = self.qkv(hidden_states).split(self.inner_dim, dim=-1)
        return self.o(self.attn(q, k, v, kv_cache, attn_metadata, position_bias=position_bias))


class T5CrossAttention(nn.Module):
    """Decoder-to-encoder attention: no position bias, unscaled scores.

    Given ``state_cache`` (the encoder states' paged rows, written once for every layer: see T5Stack), it attends
    to the encoder states themselves: each head's query is mapped through its K projection (``q_h W_k,h``, one
    d_model row per head), its scores are dot products with the encoder states, and the weighted sum of encoder
    states is mapped through its V projection afterwards. That is the same attention, reassociated, with no K/V
    projected in prefill and one d_model row read per encoder token instead of a K and a V row in every layer
    (decisions §42). Without it, K/V are projected in prefill steps and kept in this layer's cross blocks."""

    encoder_row_linears = ("kv",)    # run over the encoder's rows, not once per decode step (packed_linear)

    def __init__(self, hf_config) -> None:
        super().__init__()
        self.num_heads, self.d_kv, self.d_model = hf_config.num_heads, hf_config.d_kv, hf_config.d_model
        self.inner_dim = hf_config.num_heads * hf_config.d_kv
        self.q = nn.Linear(hf_config.d_model, self.inner_dim, bias=False)
        self.kv = FusedLinear(hf_config.d_model, self.inner_dim, ("k", "v"), bias=False)
        self.o = nn.Linear(self.inner_dim, hf_config.d_model, bias=False)
        self.attn = Attention(hf_config.num_heads, hf_config.d_kv, 1.0, attn_type=AttentionType.ENCODER_DECODER)
        self.state_attn = Attention(hf_config.num_heads, hf_config.d_model, 1.0, num_kv_heads=1,
                                    attn_type=AttentionType.ENCODER_DECODER)
        # attending to the encoder states reads kv's weight: float32 packing must leave it a plain linear
        self.float_weight_linears = ("kv",) if self.d_model == self.inner_dim else ()

    def attends_encoder_states(self) -> bool:
        """Whether this layer attends to the encoder states: its K/V projection is a float32 linear (bfloat16
        measured slower that way, int8 keeps its quantised projection) and an encoder state fits a K cache row
        exactly (d_model == num_heads * d_kv, as in every released T5 but T5-11B and mT5-small)."""
        return (self.d_model == self.inner_dim and isinstance(self.kv, nn.Linear)
                and self.kv.weight.dtype == torch.float32)

    def forward(self, hidden_states: torch.Tensor, encoder_hidden_states: Optional[torch.Tensor],
                kv_cache: Optional[KVCache], attn_metadata: AttentionMetadata,
                state_cache: Optional[KVCache] = None) -> torch.Tensor:
        if state_cache is not None:
            return self.o(self._attend_states(self.q(hidden_states), encoder_hidden_states, state_cache,
                                              attn_metadata))
        k = v = None
        if encoder_hidden_states is not None:
            k, v = self.kv(encoder_hidden_states).split(self.inner_dim, dim=-1)
        return self.o(self.attn(self.q(hidden_states), k, v, kv_cache, attn_metadata))

    def _attend_states(self, query: torch.Tensor, encoder_hidden_states: Optional[torch.Tensor],
                       state_cache: KVCache, attn_metadata: AttentionMetadata) -> torch.Tensor:
        """[num_tokens, inner_dim] attention output computed over the encoder states."""
        key_weight, value_weight = self.kv.weight.view(2, self.num_heads, self.d_kv, self.d_model)
        heads_first = query.view(-1, self.num_heads, self.d_kv).transpose(0, 1)
        state_query = torch.bmm(heads_first, key_weight).transpose(0, 1).contiguous()    # [tokens, heads, d_model]
        context = self.state_attn.attend_cached(state_query, encoder_hidden_states, encoder_hidden_states,
                                                state_cache, attn_metadata)
        context = context.view(-1, self.num_heads, self.d_model).transpose(0, 1)
        return torch.bmm(context, value_weight.transpose(1, 2)).transpose(0, 1).reshape(-1, self.inner_dim)


def feed_forward_activation(hf_config):
    """(activation name, gated) the way HF's T5Config reads ``feed_forward_proj`` ("relu", "gated-gelu", ...)."""
    if hasattr(hf_config, "dense_act_fn") and hasattr(hf_config, "is_gated_act"):
        return hf_config.dense_act_fn, bool(hf_config.is_gated_act)
    parts = hf_config.feed_forward_proj.split("-")
    if len(parts) > 2 or (len(parts) == 2 and parts[0] != "gated"):
        raise ValueError(f"feed_forward_proj must be 'ACT' or 'gated-ACT', got {hf_config.feed_forward_proj!r}")
    name = "gelu_new" if hf_config.feed_forward_proj == "gated-gelu" else parts[-1]
    return name, parts[0] == "gated"


class T5FeedForward(nn.Module):
    """``wo(act(wi(x)))`` (T5 v1.0) or ``wo(act(wi_0(x)) * wi_1(x))`` (gated: v1.1, Flan-T5, mT5, UMT5)."""

    def __init__(self, hf_config) -> None:
        super().__init__()
        activation, self.gated = feed_forward_activation(hf_config)
        self.act = get_activation(activation)
        self.fused_gelu = self.gated and activation in ("gelu_new", "gelu_fast", "gelu_pytorch_tanh")
        self.d_ff = hf_config.d_ff
        if self.gated:
            self.wi = FusedLinear(hf_config.d_model, self.d_ff, ("wi_0", "wi_1"), bias=False)
        else:
            self.wi = nn.Linear(hf_config.d_model, self.d_ff, bias=False)
        self.wo = nn.Linear(self.d_ff, hf_config.d_model, bias=False)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        if not self.gated:
            return self.wo(self.act(self.wi(hidden_states)))
        gate_linear = self.wi(hidden_states)
        if self.fused_gelu and gate_linear.dtype == torch.float32:
            return self.wo(fused_ops.gelu_tanh_and_mul(gate_linear))
        gate, linear = gate_linear.split(self.d_ff, dim=-1)
        return self.wo(self.act(gate) * linear)


class T5LayerSelfAttention(nn.Module):
    """Each sub-layer takes (output of the sub-layer before, residual stream before that output) and returns the
    same pair: the residual add is fused into the next layer norm."""

    def __init__(self, hf_config, attn_type: AttentionType, has_bias: bool) -> None:
        super().__init__()
        self.SelfAttention = T5SelfAttention(hf_config, attn_type, has_bias)
        self.layer_norm = T5LayerNorm(hf_config.d_model, hf_config.layer_norm_epsilon)

    def forward(self, hidden_states, residual, kv_cache, attn_metadata, position_bias: StepPositionBias):
        normed, residual = self.layer_norm(hidden_states, residual)
        return self.SelfAttention(normed, kv_cache, attn_metadata, position_bias), residual


class T5LayerCrossAttention(nn.Module):
    def __init__(self, hf_config) -> None:
        super().__init__()
        self.EncDecAttention = T5CrossAttention(hf_config)
        self.layer_norm = T5LayerNorm(hf_config.d_model, hf_config.layer_norm_epsilon)

    def forward(self, hidden_states, residual, encoder_hidden_states, kv_cache, attn_metadata, state_cache=None):
        normed, residual = self.layer_norm(hidden_states, residual)
        return self.EncDecAttention(normed, encoder_hidden_states, kv_cache, attn_metadata, state_cache), residual


class T5LayerFF(nn.Module):
    def __init__(self, hf_config) -> None:
        super().__init__()
        self.DenseReluDense = T5FeedForward(hf_config)
        self.layer_norm = T5LayerNorm(hf_config.d_model, hf_config.layer_norm_epsilon)

    def forward(self, hidden_states, residual):
        normed, residual = self.layer_norm(hidden_states, residual)
        return self.DenseReluDense(normed), residual
