"""Pieces shared by the encoder/decoder models (BART/mBART, Whisper): fused projections, the
encoder and decoder transformer layers over the engine's Attention layer, and strict HF-name weight loading.

Module names mirror HF transformers' so that checkpoint names map one to one, except for two fusions:
self-attention ``q_proj``/``k_proj``/``v_proj`` → ``qkv_proj`` and cross-attention ``k_proj``/``v_proj`` →
``kv_proj`` (both over the same input; the cross ``q_proj`` stays separate because its input is the decoder
stream while ``kv_proj`` runs over the encoder output once per prefill step).
"""
from __future__ import annotations

import math
from typing import Dict, Iterable, Optional, Sequence, Set, Tuple

import torch
from torch import nn

from seq2seq_engine.attention import Attention, AttentionMetadata, AttentionType
from seq2seq_engine.models.packed_linear import linear_then_activation
from seq2seq_engine.models.utils import WeightLoader, as_kv_cache_list, get_activation

KVCache = Tuple[torch.Tensor, torch.Tensor]


# ------------------------------------------------------------------------------------------------ fused linear
class FusedLinear(nn.Linear):
    """Several same-shaped HF linears over the same input, stacked on the output dimension.

    ``shard_names`` are the HF sibling module names in order (e.g. ``q_proj``, ``k_proj``, ``v_proj``);
    ``bias_shards`` are those whose bias exists in checkpoints (others keep a zero bias, e.g. Whisper's k_proj).
    """

    def __init__(self, in_features: int, shard_size: int, shard_names: Sequence[str], bias: bool = True,
                 bias_shards: Optional[Sequence[str]] = None) -> None:
        super().__init__(in_features, shard_size * len(shard_names), bias=bias)
        self.shard_size = shard_size
        self.shard_names = tuple(shard_names)
        self.bias_shards = tuple(shard_names if bias_shards is None else bias_shards)
        if self.bias is not None:
            with torch.no_grad():
                self.bias.zero_()


# ------------------------------------------------------------------------------------------------- attention
class SelfAttention(nn.Module):
    """Encoder (ENCODER) or decoder (DECODER) self-attention: fused q/k/v projection, Attention, out_proj."""

    def __init__(self, embed_dim: int, num_heads: int, attn_type: AttentionType, k_bias: bool = True) -> None:
        super().__init__()
        if embed_dim % num_heads:
            raise ValueError(f"d_model {embed_dim} is not divisible by the number of heads {num_heads}")
        self.embed_dim = embed_dim
        head_size = embed_dim // num_heads
        self.qkv_proj = FusedLinear(embed_dim, embed_dim, ("q_proj", "k_proj", "v_proj"),
                                    bias_shards=None if k_bias else ("q_proj", "v_proj"))
        self.out_proj = nn.Linear(embed_dim, embed_dim)
        self.attn = Attention(num_heads, head_size, head_size ** -0.5, attn_type=attn_type)

    def forward(self, hidden_states: torch.Tensor, kv_cache: Optional[KVCache],
                attn_metadata: AttentionMetadata) -> torch.Tensor:
        q, k, v = self.qkv_proj(hidden_states).split(self.embed_dim, dim=-1)
        return self.out_proj(self.attn(q, k, v, kv_cache, attn_metadata))


class CrossAttention(nn.Module):
    """Decoder-to-encoder attention (ENCODER_DECODER). K/V are projected from the encoder output only in steps
    that ran the encoder (prefills); the Attention layer writes them into the cross blocks and decode steps
    read them back from the cache."""

    encoder_row_linears = ("kv_proj",)    # run over the encoder's rows, not once per decode step (packed_linear)

    def __init__(self, embed_dim: int, num_heads: int, k_bias: bool = True) -> None:
        super().__init__()
        if embed_dim % num_heads:
            raise ValueError(f"d_model {embed_dim} is not divisible by the number of heads {num_heads}")
        self.embed_dim = embed_dim
        head_size = embed_dim // num_heads
        self.q_proj = nn.Linear(embed_dim, embed_dim)
        self.kv_proj = FusedLinear(embed_dim, embed_dim, ("k_proj", "v_proj"),
                                   bias_shards=None if k_bias else ("v_proj",))
        self.out_proj = nn.Linear(embed_dim, embed_dim)
        self.attn = Attention(num_heads, head_size, head_size ** -0.5, attn_type=AttentionType.ENCODER_DECODER)

    def forward(self, hidden_states: torch.Tensor, encoder_hidden_states: Optional[torch.Tensor],
                kv_cache: Optional[KVCache], attn_metadata: AttentionMetadata) -> torch.Tensor:
        q = self.q_proj(hidden_states)
        k = v = None
        if encoder_hidden_states is not None:
            k, v = self.kv_proj(encoder_hidden_states).split(self.embed_dim, dim=-1)
        return self.out_proj(self.attn(q, k, v, kv_cache, attn_metadata))


# ---------------------------------------------------------------------------------------------------- layers
def feed_forward(layer: nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
    """fc2(activation(fc1(x))) of an encoder or decoder layer; a packed fc1 applies the activation in its pass."""
    return layer.fc2(linear_then_activation(layer.fc1, layer.activation, layer.activation_fn, hidden_states))


class EncoderLayer(nn.Module):
    """Self-attention + FFN; post-norm (BART) or pre-norm (mBART, Whisper)."""

    def __init__(self, embed_dim: int, num_heads: int, ffn_dim: int, activation: str, pre_norm: bool,
                 k_bias: bool = True) -> None:
        super().__init__()
        self.pre_norm = pre_norm
        self.self_attn = SelfAttention(embed_dim, num_heads, AttentionType.ENCODER, k_bias=k_bias)
        self.self_attn_layer_norm = nn.LayerNorm(embed_dim)
        self.fc1 = nn.Linear(embed_dim, ffn_dim)
        self.fc2 = nn.Linear(ffn_dim, embed_dim)
        self.final_layer_norm = nn.LayerNorm(embed_dim)
        self.activation, self.activation_fn = activation, get_activation(activation)

    def forward(self, hidden_states: torch.Tensor, attn_metadata: AttentionMetadata) -> torch.Tensor:
        if self.pre_norm:
            hidden_states = hidden_states + self.self_attn(self.self_attn_layer_norm(hidden_states), None,
                                                           attn_metadata)
            return hidden_states + feed_forward(self, self.final_layer_norm(hidden_states))
        hidden_states = self.self_attn_layer_norm(hidden_states + self.self_attn(hidden_states, None, attn_metadata))
        return self.final_layer_norm(hidden_states + feed_forward(self, hidden_states))


class DecoderLayer(nn.Module):
    """Causal self-attention + cross-attention + FFN; one (key_cache, value_cache) pair serves both attentions
    (self and cross blocks are disjoint block numbers of the same tensors)."""

    def __init__(self, embed_dim: int, num_heads: int, ffn_dim: int, activation: str, pre_norm: bool,
                 k_bias: bool = True) -> None:
        super().__init__()
        self.pre_norm = pre_norm
        self.self_attn = SelfAttention(embed_dim, num_heads, AttentionType.DECODER, k_bias=k_bias)
        self.self_attn_layer_norm = nn.LayerNorm(embed_dim)
        self.encoder_attn = CrossAttention(embed_dim, num_heads, k_bias=k_bias)
        self.encoder_attn_layer_norm = nn.LayerNorm(embed_dim)
        self.fc1 = nn.Linear(embed_dim, ffn_dim)
        self.fc2 = nn.Linear(ffn_dim, embed_dim)
        self.final_layer_norm = nn.LayerNorm(embed_dim)
        self.activation, self.activation_fn = activation, get_activation(activation)

    def forward(self, hidden_states: torch.Tensor, encoder_hidden_states: Optional[torch.Tensor],
                kv_cache: Optional[KVCache], attn_metadata: AttentionMetadata) -> torch.Tensor:
        if self.pre_norm:
            hidden_states = hidden_states + self.self_attn(self.self_attn_layer_norm(hidden_states), kv_cache,
                                                           attn_metadata)
            hidden_states = hidden_states + self.encoder_attn(self.encoder_attn_layer_norm(hidden_states),
                                                              encoder_hidden_states, kv_cache, attn_metadata)
            ffn_in = self.final_layer_norm(hidden_states)
            return hidden_states + feed_forward(self, ffn_in)
        hidden_states = self.self_attn_layer_norm(
            hidden_states + self.self_attn(hidden_states, kv_cache, attn_metadata))
        hidden_states = self.encoder_attn_layer_norm(
            hidden_states + self.encoder_attn(hidden_states, encoder_hidden_states, kv_cache, attn_metadata))
        return self.final_layer_norm(hidden_states + feed_forward(self, hidden_states))


class EncoderDecoderForGeneration(nn.Module):
    """The forward shared by encoder/decoder models: the encoder runs only in steps that hold prefill requests
    (attn_metadata.encoder is set), its output feeds the cross-attention layers, then the decoder runs.
    Subclasses provide `encode(attn_metadata, **encoder_inputs)`, `decode(...)` and `num_decoder_layers`."""

    is_encoder_decoder = True
    supports_lora = True    # seq2seq_engine/lora/ adapts its linears (the names come from build_weight_map)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches, attn_metadata: AttentionMetadata,
                encoder_input_ids: Optional[torch.Tensor] = None, encoder_positions: Optional[torch.Tensor] = None,
                encoder_features: Optional[torch.Tensor] = None) -> torch.Tensor:
        encoder_hidden_states = None
        if attn_metadata.encoder is not None:
            encoder_hidden_states = self.encode(attn_metadata, encoder_input_ids=encoder_input_ids,
                                                encoder_positions=encoder_positions,
                                                encoder_features=encoder_features)
        caches = as_kv_cache_list(kv_caches, self.num_decoder_layers)
        return self.decode(input_ids, positions, encoder_hidden_states, caches, attn_metadata)


def segment_positions(attn_metadata: AttentionMetadata, device: torch.device) -> torch.Tensor:
    """0..len-1 for each encoder sequence of this step, concatenated (from the encoder bias' segments)."""
    starts = attn_metadata.encoder.bias.q_seqinfo.seqstart_py
    return torch.cat([torch.arange(end - start, device=device) for start, end in zip(starts[:-1], starts[1:])])


# ------------------------------------------------------------------------------------------- weight loading
_Target = Tuple[str, Optional[Tuple[int, int]]]   # (parameter name, (row offset, rows) or None)


def build_weight_map(module: nn.Module) -> Dict[str, _Target]:
    """HF checkpoint name → (parameter name, shard) in ``module``; FusedLinear parameters split into shards."""
    targets: Dict[str, _Target] = {}
    fused_params: Set[str] = set()
    for mod_name, mod in module.named_modules():
        if not isinstance(mod, FusedLinear):
            continue
        parent = mod_name.rsplit(".", 1)[0] + "." if "." in mod_name else ""
        for index, shard in enumerate(mod.shard_names):
            rows = (index * mod.shard_size, mod.shard_size)
            targets[f"{parent}{shard}.weight"] = (f"{mod_name}.weight", rows)
            if mod.bias is not None and shard in mod.bias_shards:
                targets[f"{parent}{shard}.bias"] = (f"{mod_name}.bias", rows)
        fused_params.update({f"{mod_name}.weight", f"{mod_name}.bias"})
    for name, _ in module.named_parameters():
        if name not in fused_params:
            targets[name] = (name, None)
    return targets


def load_hf_weights(module: nn.Module, weights: Iterable[Tuple[str, torch.Tensor]],
                    aliases: Optional[Dict[str, str]] = None, allow_missing: Iterable[str] = (),
                    ignore: Iterable[str] = (), prefix_fallback: str = "") -> None:
    """Strictly copy HF-named tensors into ``module`` through models.utils.WeightLoader.

    ``aliases``: checkpoint names holding the same tensor as another (tied embeddings): loaded into that target
    only if it has not been loaded already, and never required. ``allow_missing``: parameters that may be absent
    (they keep their initial value, e.g. a zero final_logits_bias). ``ignore``: checkpoint names dropped silently.
    ``prefix_fallback``: a prefix tried for names not found as given (``"model."`` for checkpoints saved from the
    base model). Fused projections (FusedLinear)
    take their HF q/k/v shards; shards without a checkpoint bias (Whisper's k_proj) stay zero.
    ValueError names an unexpected, mismatched, duplicated or missing tensor.
    """
    targets = build_weight_map(module)
    aliases, ignore = dict(aliases or {}), set(ignore)
    tied_targets = set(aliases.values())
    known = set(targets) | set(aliases) | ignore
    loader = WeightLoader(module, allow_missing=allow_missing)
    loaded: Set[str] = set()
    for source, tensor in weights:
        if loader.ignored(source):
            continue
        name = source
        if name not in known and prefix_fallback and prefix_fallback + name in known:
            name = prefix_fallback + name
        if name in ignore:
            continue
        name = aliases.get(name, name)
        if name in loaded and name in tied_targets:
            continue                     # a tied tensor seen under another of its names
        if name not in targets:
            raise ValueError(f"unexpected checkpoint tensor {source!r} (shape {tuple(tensor.shape)})")
        param_name, shard = targets[name]
        loader.load(param_name, tensor, source=source, shard=shard)
        loaded.add(name)
    missing = [name for name in targets if name not in loaded and targets[name][0] not in loader.allow_missing]
    if missing:
        raise ValueError("checkpoint is missing tensors: " + ", ".join(sorted(missing)))


def embed_scale(hf_config) -> float:
    return math.sqrt(hf_config.d_model) if getattr(hf_config, "scale_embedding", False) else 1.0
