"""OPT decoder-only model over the engine's Attention layer: learned positions (offset 2), pre- or post-norm
blocks (`do_layer_norm_before`), ReLU MLP, optional project_in/project_out when `word_embed_proj_dim` differs from
`hidden_size`, lm_head tied to the token embeddings. q/k/v are fused into one projection."""
from __future__ import annotations

from typing import Iterable, Optional, Tuple

import torch
from torch import nn

from seq2seq_engine.attention import Attention, AttentionMetadata, AttentionType

from .utils import WeightLoader, as_kv_cache_list, fused_qkv_attention, get_activation, head_dim_of

POSITION_OFFSET = 2  # OPT's learned positional embedding table starts at index 2
_QKV = (("self_attn.q_proj.", 0), ("self_attn.k_proj.", 1), ("self_attn.v_proj.", 2))


class OPTAttention(nn.Module):
    def __init__(self, config) -> None:
        super().__init__()
        hidden = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.head_dim = head_dim_of(hidden, self.num_heads)
        bias = bool(getattr(config, "enable_bias", True))
        self.qkv_proj = nn.Linear(hidden, 3 * hidden, bias=bias)
        self.out_proj = nn.Linear(hidden, hidden, bias=bias)
        self.attn = Attention(self.num_heads, self.head_dim, self.head_dim ** -0.5, self.num_heads,
                              AttentionType.DECODER)

    def forward(self, hidden_states, kv_cache, attn_metadata):
        return self.out_proj(fused_qkv_attention(self.qkv_proj(hidden_states), self.attn, kv_cache, attn_metadata))


class OPTDecoderLayer(nn.Module):
    def __init__(self, config) -> None:
        super().__init__()
        affine = bool(getattr(config, "layer_norm_elementwise_affine", True))
        bias = bool(getattr(config, "enable_bias", True))
        self.do_layer_norm_before = bool(getattr(config, "do_layer_norm_before", True))
        self.self_attn = OPTAttention(config)
        self.self_attn_layer_norm = nn.LayerNorm(config.hidden_size, elementwise_affine=affine)
        self.fc1 = nn.Linear(config.hidden_size, config.ffn_dim, bias=bias)
        self.fc2 = nn.Linear(config.ffn_dim, config.hidden_size, bias=bias)
        self.final_layer_norm = nn.LayerNorm(config.hidden_size, elementwise_affine=affine)
        self.act = get_activation(getattr(config, "activation_function", "relu"))

    def forward(self, hidden_states, kv_cache, attn_metadata):
        pre_norm = self.do_layer_norm_before
        residual = hidden_states
        if pre_norm:
            hidden_states = self.self_attn_layer_norm(hidden_states)
        hidden_states = residual + self.self_attn(hidden_states, kv_cache, attn_metadata)
        if not pre_norm:
            hidden_states = self.self_attn_layer_norm(hidden_states)
        residual = hidden_states
        if pre_norm:
            hidden_states = self.final_layer_norm(hidden_states)
        hidden_states = residual + self.fc2(self.act(self.fc1(hidden_states)))
        if not pre_norm:
            hidden_states = self.final_layer_norm(hidden_states)
        return hidden_states


class OPTDecoder(nn.Module):
    def __init__(self, config) -> None:
        super().__init__()
        proj_dim = getattr(config, "word_embed_proj_dim", None) or config.hidden_size
        self.embed_tokens = nn.Embedding(config.vocab_size, proj_dim)
        self.embed_positions = nn.Embedding(config.max_position_embeddings + POSITION_OFFSET, config.hidden_size)
        if proj_dim != config.hidden_size:
            self.project_out = nn.Linear(config.hidden_size, proj_dim, bias=False)
            self.project_in = nn.Linear(proj_dim, config.hidden_size, bias=False)
        else:
            self.project_out = self.project_in = None
        if getattr(config, "do_layer_norm_before", True) and not getattr(config, "_remove_final_layer_norm", False):
            affine = bool(getattr(config, "layer_norm_elementwise_affine", True))
            self.final_layer_norm = nn.LayerNorm(config.hidden_size, elementwise_affine=affine)
        else:
            self.final_layer_norm = None
        self.layers = nn.ModuleList(OPTDecoderLayer(config) for _ in range(config.num_hidden_layers))


class OPTModel(nn.Module):
    def __init__(self, config) -> None:
        super().__init__()
        self.decoder = OPTDecoder(config)


class OPTForCausalLM(nn.Module):
    """`forward` returns [num_tokens, word_embed_proj_dim] hidden states (after project_out, which is the
    identity when word_embed_proj_dim == hidden_size): the input of the lm_head."""

    is_encoder_decoder = False

    def __init__(self, hf_config) -> None:
        super().__init__()
        self.config = hf_config
        self.model = OPTModel(hf_config)
        decoder = self.model.decoder
        self.tie_word_embeddings = bool(getattr(hf_config, "tie_word_embeddings", True))
        self.lm_head = nn.Linear(decoder.embed_tokens.embedding_dim, hf_config.vocab_size, bias=False)
        if self.tie_word_embeddings:
            self.lm_head.weight = decoder.embed_tokens.weight

    def kv_cache_spec(self) -> Tuple[int, int, int]:
        attn = self.model.decoder.layers[0].self_attn
        return len(self.model.decoder.layers), attn.num_heads, attn.head_dim

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches, attn_metadata: AttentionMetadata,
                encoder_input_ids: Optional[torch.Tensor] = None, encoder_positions: Optional[torch.Tensor] = None,
                encoder_features: Optional[torch.Tensor] = None) -> torch.Tensor:
        decoder = self.model.decoder
        kv_caches = as_kv_cache_list(kv_caches, len(decoder.layers))
        hidden_states = decoder.embed_tokens(input_ids)
        if decoder.project_in is not None:
            hidden_states = decoder.project_in(hidden_states)
        hidden_states = hidden_states + decoder.embed_positions(positions + POSITION_OFFSET)
        for layer, kv_cache in zip(decoder.layers, kv_caches):
            hidden_states = layer(hidden_states, kv_cache, attn_metadata)
        if decoder.final_layer_norm is not None:
            hidden_states = decoder.final_layer_norm(hidden_states)
        if decoder.project_out is not None:
            hidden_states = decoder.project_out(hidden_states)
        return hidden_states

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden_states).float()

    def load_weights(self, weights: Iterable[Tuple[str, torch.Tensor]]) -> None:
        loader = WeightLoader(self, allow_missing=("lm_head.weight",) if self.tie_word_embeddings else ())
        hidden = self.config.hidden_size
        for name, tensor in weights:
            if loader.ignored(name):
                continue
            if self.tie_word_embeddings and name == "lm_head.weight":
                continue
            # Original metaseq-converted checkpoints name the decoder "decoder.*" without "model.".
            param_name = "model." + name if name.startswith("decoder.") else name
            for part, index in _QKV:
                if part in param_name:
                    loader.load(param_name.replace(part, "self_attn.qkv_proj."), tensor, source=name,
                                shard=(index * hidden, hidden))
                    break
            else:
                loader.load(param_name, tensor, source=name)
        loader.finish()
