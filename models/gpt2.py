"""GPT-2 decoder-only model over the engine's Attention layer: learned positions, pre-norm blocks, gelu_new MLP,
lm_head tied to the token embeddings. HF stores GPT-2 projections as Conv1D ([in, out]); they are transposed into
nn.Linear on load."""
from __future__ import annotations

from typing import Iterable, Optional, Tuple

import torch
from torch import nn

from seq2seq_engine.attention import Attention, AttentionMetadata, AttentionType

from .utils import WeightLoader, as_kv_cache_list, fused_qkv_attention, get_activation, head_dim_of

_CONV1D_WEIGHTS = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


class GPT2Attention(nn.Module):
    def __init__(self, config, layer_idx: int) -> None:
        super().__init__()
        hidden = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.head_dim = head_dim_of(hidden, self.num_heads)
        scale = self.head_dim ** -0.5 if getattr(config, "scale_attn_weights", True) else 1.0
        if getattr(config, "scale_attn_by_inverse_layer_idx", False):
            scale /= float(layer_idx + 1)
        self.c_attn = nn.Linear(hidden, 3 * hidden)
        self.c_proj = nn.Linear(hidden, hidden)
        self.attn = Attention(self.num_heads, self.head_dim, scale, self.num_heads, AttentionType.DECODER)

    def forward(self, hidden_states, kv_cache, attn_metadata):
        return self.c_proj(fused_qkv_attention(self.c_attn(hidden_states), self.attn, kv_cache, attn_metadata))


class GPT2MLP(nn.Module):
    def __init__(self, config) -> None:
        super().__init__()
        inner = getattr(config, "n_inner", None) or 4 * config.hidden_size
        self.c_fc = nn.Linear(config.hidden_size, inner)
        self.c_proj = nn.Linear(inner, config.hidden_size)
        self.act = get_activation(getattr(config, "activation_function", "gelu_new"))

    def forward(self, x):
        return self.c_proj(self.act(self.c_fc(x)))


class GPT2Block(nn.Module):
    def __init__(self, config, layer_idx: int) -> None:
        super().__init__()
        eps = getattr(config, "layer_norm_epsilon", 1e-5)
        self.ln_1 = nn.LayerNorm(config.hidden_size, eps=eps)
        self.attn = GPT2Attention(config, layer_idx)
        self.ln_2 = nn.LayerNorm(config.hidden_size, eps=eps)
        self.mlp = GPT2MLP(config)

    def forward(self, hidden_states, kv_cache, attn_metadata):
        hidden_states = hidden_states + self.attn(self.ln_1(hidden_states), kv_cache, attn_metadata)
        return hidden_states + self.mlp(self.ln_2(hidden_states))


class GPT2Model(nn.Module):
    def __init__(self, config) -> None:
        super().__init__()
        self.wte = nn.Embedding(config.vocab_size, config.hidden_size)
        self.wpe = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.h = nn.ModuleList(GPT2Block(config, i) for i in range(config.num_hidden_layers))
        self.ln_f = nn.LayerNorm(config.hidden_size, eps=getattr(config, "layer_norm_epsilon", 1e-5))


class GPT2LMHeadModel(nn.Module):
    is_encoder_decoder = False

    def __init__(self, hf_config) -> None:
        super().__init__()
        if getattr(hf_config, "add_cross_attention", False):
            raise ValueError("GPT-2 with cross-attention (add_cross_attention=True) is not supported")
        self.config = hf_config
        self.transformer = GPT2Model(hf_config)
        self.tie_word_embeddings = bool(getattr(hf_config, "tie_word_embeddings", True))
        self.lm_head = nn.Linear(hf_config.hidden_size, hf_config.vocab_size, bias=False)
        if self.tie_word_embeddings:
            self.lm_head.weight = self.transformer.wte.weight

    def kv_cache_spec(self) -> Tuple[int, int, int]:
        attn = self.transformer.h[0].attn
        return len(self.transformer.h), attn.num_heads, attn.head_dim

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches, attn_metadata: AttentionMetadata,
                encoder_input_ids: Optional[torch.Tensor] = None, encoder_positions: Optional[torch.Tensor] = None,
                encoder_features: Optional[torch.Tensor] = None) -> torch.Tensor:
        kv_caches = as_kv_cache_list(kv_caches, len(self.transformer.h))
        hidden_states = self.transformer.wte(input_ids) + self.transformer.wpe(positions)
        for block, kv_cache in zip(self.transformer.h, kv_caches):
            hidden_states = block(hidden_states, kv_cache, attn_metadata)
        return self.transformer.ln_f(hidden_states)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden_states).float()

    def load_weights(self, weights: Iterable[Tuple[str, torch.Tensor]]) -> None:
        loader = WeightLoader(self, allow_missing=("lm_head.weight",) if self.tie_word_embeddings else ())
        for name, tensor in weights:
            if loader.ignored(name):
                continue
            if self.tie_word_embeddings and name == "lm_head.weight":
                continue
            # Original OpenAI-converted checkpoints name the GPT2Model parameters without "transformer.".
            param_name = name if name.startswith(("transformer.", "lm_head.")) else "transformer." + name
            transform = torch.t if param_name.endswith(_CONV1D_WEIGHTS) else None
            loader.load(param_name, tensor, source=name, transform=transform)
        loader.finish()
