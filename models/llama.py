"""Llama (and Llama-shaped: SmolLM, TinyLlama, ...) decoder-only model over the engine's Attention layer.

RMSNorm, rotary embeddings (default / linear / llama3 scaling), grouped-query attention, SiLU-gated MLP.
The q/k/v and gate/up projections are fused; `load_weights` maps HF checkpoint names onto the fused shards.
"""
from __future__ import annotations

import math
from typing import Dict, Iterable, Optional, Tuple

import torch
from torch import nn

from seq2seq_engine.attention import Attention, AttentionMetadata, AttentionType
from seq2seq_engine.kernels import native_fused as fused_ops

from .utils import WeightLoader, as_kv_cache_list, get_activation


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor, residual: Optional[torch.Tensor] = None):
        """As HF computes it (normalise in float32, cast back, then scale), fused with the residual add:
        returns (normed, x + residual), or (normed, None) without a residual."""
        return fused_ops.rms_norm(x, self.weight, self.eps, residual)


def rope_parameters(config) -> dict:
    """Rotary parameters from a transformers-5 `rope_parameters` dict or the older `rope_theta`/`rope_scaling`."""
    params = getattr(config, "rope_parameters", None)
    params = dict(params) if isinstance(params, dict) and params else dict(getattr(config, "rope_scaling", None) or {})
    params.setdefault("rope_theta", getattr(config, "rope_theta", None) or 10000.0)
    params["rope_type"] = params.get("rope_type", params.get("type")) or "default"
    return params


def rope_inv_freq(config, head_dim: int) -> torch.Tensor:
    """float32 inverse frequencies [head_dim // 2] for the config's rotary type."""
    params = rope_parameters(config)
    base = float(params["rope_theta"])
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    rope_type = params["rope_type"]
    if rope_type == "default":
        return inv_freq
    if rope_type == "linear":
        return inv_freq / float(params["factor"])
    if rope_type == "llama3":
        factor = float(params["factor"])
        low_freq_factor = float(params["low_freq_factor"])
        high_freq_factor = float(params["high_freq_factor"])
        old_context_len = params["original_max_position_embeddings"]
        low_freq_wavelen = old_context_len / low_freq_factor
        high_freq_wavelen = old_context_len / high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
        smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
        return torch.where(is_medium, smoothed, scaled)
    raise ValueError(f"unsupported rope type {rope_type!r} (supported: default, linear, llama3)")


class RotaryEmbedding(nn.Module):
    """Holds the float32 inverse frequencies. Not a buffer: `model.to(dtype)` moves them with the model but
    keeps them float32, so bf16/fp16 models rotate with exact frequencies (as HF does)."""

    def __init__(self, inv_freq: torch.Tensor) -> None:
        super().__init__()
        self.inv_freq = inv_freq.float()

    def _apply(self, fn, recurse=True):
        self.inv_freq = self.inv_freq.to(device=fn(self.inv_freq).device)
        return super()._apply(fn, recurse)

    def forward(self, positions: torch.Tensor, dtype: torch.dtype):
        """cos/sin [num_tokens, head_dim] (halves repeated, neox layout), computed in float32."""
        freqs = positions.float()[:, None] * self.inv_freq.to(positions.device)[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)


class LlamaAttention(nn.Module):
    def __init__(self, config) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = getattr(config, "num_key_value_heads", None) or self.num_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.num_heads
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        bias = bool(getattr(config, "attention_bias", False))
        self.qkv_proj = nn.Linear(config.hidden_size, self.q_size + 2 * self.kv_size, bias=bias)
        self.o_proj = nn.Linear(self.q_size, config.hidden_size, bias=bias)
        self.attn = Attention(self.num_heads, self.head_dim, self.head_dim ** -0.5, self.num_kv_heads,
                              AttentionType.DECODER)

    def forward(self, hidden_states, cos, sin, kv_cache, attn_metadata):
        qkv = self.qkv_proj(hidden_states)
        q = fused_ops.rotary_neox(qkv, 0, self.num_heads, self.head_dim, cos, sin)
        k = fused_ops.rotary_neox(qkv, self.q_size, self.num_kv_heads, self.head_dim, cos, sin)
        v = qkv[:, self.q_size + self.kv_size:].contiguous()
        return self.o_proj(self.attn(q, k, v, kv_cache, attn_metadata))


class LlamaMLP(nn.Module):
    def __init__(self, config) -> None:
        super().__init__()
        bias = bool(getattr(config, "mlp_bias", False))
        self.intermediate_size = config.intermediate_size
        self.gate_up_proj = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=bias)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=bias)
        hidden_act = getattr(config, "hidden_act", "silu")
        self.act = get_activation(hidden_act)
        self.fused_silu = hidden_act in ("silu", "swish")

    def forward(self, x):
        gate_up = self.gate_up_proj(x)
        if self.fused_silu:
            return self.down_proj(fused_ops.silu_and_mul(gate_up))
        gate, up = gate_up.split(self.intermediate_size, dim=-1)
        return self.down_proj(self.act(gate) * up)


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config) -> None:
        super().__init__()
        eps = getattr(config, "rms_norm_eps", 1e-6)
        self.input_layernorm = RMSNorm(config.hidden_size, eps)
        self.self_attn = LlamaAttention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps)
        self.mlp = LlamaMLP(config)

    def forward(self, hidden_states, residual, cos, sin, kv_cache, attn_metadata):
        """(MLP output, residual stream before it): the residual add is fused into the next layer's norm."""
        if residual is None:
            normed, residual = self.input_layernorm(hidden_states)[0], hidden_states
        else:
            normed, residual = self.input_layernorm(hidden_states, residual)
        attn_out = self.self_attn(normed, cos, sin, kv_cache, attn_metadata)
        normed, residual = self.post_attention_layernorm(attn_out, residual)
        return self.mlp(normed), residual


class LlamaModel(nn.Module):
    def __init__(self, config) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(LlamaDecoderLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, getattr(config, "rms_norm_eps", 1e-6))


# HF name suffix -> (fused parameter suffix, shard index) for the fused projections.
_FUSED = (("self_attn.q_proj", "self_attn.qkv_proj", 0), ("self_attn.k_proj", "self_attn.qkv_proj", 1),
          ("self_attn.v_proj", "self_attn.qkv_proj", 2), ("mlp.gate_proj", "mlp.gate_up_proj", 0),
          ("mlp.up_proj", "mlp.gate_up_proj", 1))


class LlamaForCausalLM(nn.Module):
    is_encoder_decoder = False
    supports_lora = True

    def __init__(self, hf_config) -> None:
        super().__init__()
        self.config = hf_config
        self.model = LlamaModel(hf_config)
        self.tie_word_embeddings = bool(getattr(hf_config, "tie_word_embeddings", False))
        self.lm_head = nn.Linear(hf_config.hidden_size, hf_config.vocab_size, bias=False)
        if self.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        attn = self.model.layers[0].self_attn
        self.num_heads, self.num_kv_heads, self.head_dim = attn.num_heads, attn.num_kv_heads, attn.head_dim
        self.rotary_emb = RotaryEmbedding(rope_inv_freq(hf_config, self.head_dim))

    def kv_cache_spec(self) -> Tuple[int, int, int]:
        return len(self.model.layers), self.num_kv_heads, self.head_dim

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches, attn_metadata: AttentionMetadata,
                encoder_input_ids: Optional[torch.Tensor] = None, encoder_positions: Optional[torch.Tensor] = None,
                encoder_features: Optional[torch.Tensor] = None) -> torch.Tensor:
        kv_caches = as_kv_cache_list(kv_caches, len(self.model.layers))
        hidden_states = self.model.embed_tokens(input_ids)
        cos, sin = self.rotary_emb(positions, hidden_states.dtype)
        residual = None
        for layer, kv_cache in zip(self.model.layers, kv_caches):
            hidden_states, residual = layer(hidden_states, residual, cos, sin, kv_cache, attn_metadata)
        return self.model.norm(hidden_states, residual)[0]

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden_states).float()

    def _shard(self, fused: str, index: int) -> Tuple[int, int]:
        attn = self.model.layers[0].self_attn
        if fused.endswith("qkv_proj"):
            sizes = (attn.q_size, attn.kv_size, attn.kv_size)
        else:
            sizes = (self.model.layers[0].mlp.intermediate_size,) * 2
        return sum(sizes[:index]), sizes[index]

    def hf_weight_target(self, name: str) -> Tuple[str, Optional[Tuple[int, int]]]:
        """(parameter name, (row offset, rows) of a fused projection or None) of an HF checkpoint name."""
        for hf_part, fused, index in _FUSED:
            if f".{hf_part}." in name:
                return name.replace(hf_part, fused), self._shard(fused, index)
        return name, None

    def hf_weight_targets(self) -> Dict[str, Tuple[str, Optional[Tuple[int, int]]]]:
        """Every HF linear weight name -> hf_weight_target (the names LoRA adapters use)."""
        names = [name for name, _ in self.named_parameters()]
        names += [f"{name.replace(fused, hf_part)}" for hf_part, fused, _ in _FUSED for name in names if fused in name]
        return {name: self.hf_weight_target(name) for name in names if not any(
            f".{fused}." in name for _, fused, _ in _FUSED)}

    def load_weights(self, weights: Iterable[Tuple[str, torch.Tensor]]) -> None:
        loader = WeightLoader(self, allow_missing=("lm_head.weight",) if self.tie_word_embeddings else ())
        for name, tensor in weights:
            if loader.ignored(name):
                continue
            if self.tie_word_embeddings and name == "lm_head.weight":
                continue  # tied to the embeddings; some checkpoints store the copy anyway
            param, shard = self.hf_weight_target(name)
            loader.load(param, tensor, source=name, shard=shard)
        loader.finish()
