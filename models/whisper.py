"""Whisper (speech encoder/decoder) on the engine's Attention layer.

Encoder: log-mel [n, num_mel_bins, 2 * max_source_positions] → conv1 (k3, p1) + GELU → conv2 (k3, s2, p1) + GELU
→ + embed_positions (sinusoids stored as a checkpoint tensor) → pre-norm layers → layer_norm; the requests'
encoder outputs are flattened to [n * max_source_positions, d_model]. Decoder: token + learned position
embeddings (no scaling) → pre-norm layers with self- and cross-attention → layer_norm; proj_out is tied to
``model.decoder.embed_tokens``. k_proj has no bias anywhere (the fused projections keep a zero k bias).
"""
from __future__ import annotations

from typing import Iterable, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from seq2seq_engine.attention import AttentionMetadata
from seq2seq_engine.models.encoder_decoder_utils import (DecoderLayer, EncoderDecoderForGeneration, EncoderLayer,
                                                         load_hf_weights)


class WhisperEncoder(nn.Module):
    def __init__(self, hf_config) -> None:
        super().__init__()
        d_model = hf_config.d_model
        self.num_mel_bins = hf_config.num_mel_bins
        self.max_source_positions = hf_config.max_source_positions
        self.conv1 = nn.Conv1d(self.num_mel_bins, d_model, kernel_size=3, padding=1)
        self.conv2 = nn.Conv1d(d_model, d_model, kernel_size=3, stride=2, padding=1)
        self.embed_positions = nn.Embedding(self.max_source_positions, d_model)
        self.layers = nn.ModuleList([
            EncoderLayer(d_model, hf_config.encoder_attention_heads, hf_config.encoder_ffn_dim,
                         hf_config.activation_function, pre_norm=True, k_bias=False)
            for _ in range(hf_config.encoder_layers)])
        self.layer_norm = nn.LayerNorm(d_model)

    @property
    def num_input_frames(self) -> int:
        return 2 * self.max_source_positions

    def forward(self, input_features: torch.Tensor, attn_metadata: AttentionMetadata) -> torch.Tensor:
        """input_features [n, num_mel_bins, 2 * max_source_positions] → [n * max_source_positions, d_model]."""
        if input_features.dim() == 2:
            input_features = input_features.unsqueeze(0)
        if input_features.shape[1:] != (self.num_mel_bins, self.num_input_frames):
            raise ValueError(f"Whisper expects input features of shape [n, {self.num_mel_bins}, "
                             f"{self.num_input_frames}], got {tuple(input_features.shape)}")
        input_features = input_features.to(dtype=self.conv1.weight.dtype, device=self.conv1.weight.device)
        hidden_states = F.gelu(self.conv1(input_features))
        hidden_states = F.gelu(self.conv2(hidden_states))                  # [n, d, max_source_positions]
        # row-major before the layers: the transposed conv output would give every later op (norms, residual adds,
        # the linears' inputs) column-major strides, several times slower on the CPU
        hidden_states = hidden_states.transpose(1, 2).contiguous()
        hidden_states += self.embed_positions.weight
        hidden_states = hidden_states.view(-1, hidden_states.shape[-1])
        for layer in self.layers:
            hidden_states = layer(hidden_states, attn_metadata)
        return self.layer_norm(hidden_states)


class WhisperDecoder(nn.Module):
    def __init__(self, hf_config) -> None:
        super().__init__()
        d_model = hf_config.d_model
        self.embed_tokens = nn.Embedding(hf_config.vocab_size, d_model)
        self.embed_positions = nn.Embedding(hf_config.max_target_positions, d_model)
        self.layers = nn.ModuleList([
            DecoderLayer(d_model, hf_config.decoder_attention_heads, hf_config.decoder_ffn_dim,
                         hf_config.activation_function, pre_norm=True, k_bias=False)
            for _ in range(hf_config.decoder_layers)])
        self.layer_norm = nn.LayerNorm(d_model)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                encoder_hidden_states: Optional[torch.Tensor], kv_caches, attn_metadata: AttentionMetadata):
        hidden_states = self.embed_tokens(input_ids) + self.embed_positions(positions)
        for layer, kv_cache in zip(self.layers, kv_caches):
            hidden_states = layer(hidden_states, encoder_hidden_states, kv_cache, attn_metadata)
        return self.layer_norm(hidden_states)


class WhisperModel(nn.Module):
    def __init__(self, hf_config) -> None:
        super().__init__()
        self.encoder = WhisperEncoder(hf_config)
        self.decoder = WhisperDecoder(hf_config)


class WhisperForConditionalGeneration(EncoderDecoderForGeneration):
    """Whisper for generation. Each prefill request contributes ``max_source_positions`` encoder tokens (1500 for
    the released models): the runner's encoder lengths / cross slots must use that count."""

    def __init__(self, hf_config) -> None:
        super().__init__()
        self.config = hf_config
        self.model = WhisperModel(hf_config)
        self.tie_word_embeddings = getattr(hf_config, "tie_word_embeddings", True)
        self.proj_out = (None if self.tie_word_embeddings
                         else nn.Linear(hf_config.d_model, hf_config.vocab_size, bias=False))

    @property
    def num_decoder_layers(self) -> int:
        return len(self.model.decoder.layers)

    def encode(self, attn_metadata: AttentionMetadata, encoder_features: Optional[torch.Tensor] = None,
               **unused_inputs) -> torch.Tensor:
        if encoder_features is None:
            raise ValueError("this step runs the encoder (attn_metadata.encoder is set) but no "
                             "encoder_features (log-mel input features) were given")
        return self.model.encoder(encoder_features, attn_metadata)

    def decode(self, input_ids, positions, encoder_hidden_states, caches, attn_metadata) -> torch.Tensor:
        return self.model.decoder(input_ids, positions, encoder_hidden_states, caches, attn_metadata)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        if self.proj_out is None:
            return F.linear(hidden_states, self.model.decoder.embed_tokens.weight).float()
        return self.proj_out(hidden_states).float()

    def tied_lm_head_weight(self) -> Optional[torch.Tensor]:
        """The embedding matrix the logits projection reuses (None when proj_out has its own weight)."""
        return self.model.decoder.embed_tokens.weight if self.proj_out is None else None

    def set_lm_head(self, head: nn.Module) -> None:
        """Give the logits projection its own module (an int8 copy of the tied weight, models/int8.py)."""
        self.proj_out = head

    def load_weights(self, weights: Iterable[Tuple[str, torch.Tensor]]) -> None:
        aliases = {"proj_out.weight": "model.decoder.embed_tokens.weight"} if self.tie_word_embeddings else {}
        load_hf_weights(self, weights, aliases=aliases, prefix_fallback="model.")

    def kv_cache_spec(self) -> Tuple[int, int, int]:
        cfg = self.config
        return cfg.decoder_layers, cfg.decoder_attention_heads, cfg.d_model // cfg.decoder_attention_heads
