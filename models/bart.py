"""BART and mBART (encoder/decoder, learned positions with offset 2) on the engine's Attention layer.

BART: post-norm layers, ``layernorm_embedding`` after token + position embeddings. mBART: the same with pre-norm
layers and a final ``layer_norm`` at the end of the encoder and of the decoder. Both: token embeddings scaled by
sqrt(d_model) when ``config.scale_embedding``, ``final_logits_bias``, lm_head tied to ``model.shared``.
"""
from __future__ import annotations

from typing import Iterable, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from seq2seq_engine.attention import AttentionMetadata
from seq2seq_engine.models.encoder_decoder_utils import (DecoderLayer, EncoderDecoderForGeneration, EncoderLayer,
                                                         KVCache, embed_scale, load_hf_weights, segment_positions)
from seq2seq_engine.models.int8 import Int8Linear
from seq2seq_engine.models.packed_linear import PackedLinear

POSITION_OFFSET = 2   # BART/mBART learned position tables start at index 2 (fairseq padding legacy)


class _EmbeddingStack(nn.Module):
    """Token (scaled) + learned position (offset 2) embeddings and layernorm_embedding."""

    def __init__(self, hf_config, own_embed_tokens: bool) -> None:
        super().__init__()
        self.embed_scale = embed_scale(hf_config)
        # Tied models (the norm) share model.shared; with tie_word_embeddings=False transformers keeps separate
        # encoder/decoder token embeddings (and an unused model.shared).
        self.embed_tokens = nn.Embedding(hf_config.vocab_size, hf_config.d_model) if own_embed_tokens else None
        self.embed_positions = nn.Embedding(hf_config.max_position_embeddings + POSITION_OFFSET, hf_config.d_model)
        self.layernorm_embedding = nn.LayerNorm(hf_config.d_model)

    def embed(self, shared: Optional[nn.Embedding], input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        hidden_states = (self.embed_tokens if self.embed_tokens is not None else shared)(input_ids)
        if self.embed_scale != 1.0:
            hidden_states = hidden_states * self.embed_scale
        hidden_states = hidden_states + self.embed_positions(positions + POSITION_OFFSET)
        return self.layernorm_embedding(hidden_states)


class BartEncoder(_EmbeddingStack):
    def __init__(self, hf_config, pre_norm: bool, final_layer_norm: bool, own_embed_tokens: bool) -> None:
        super().__init__(hf_config, own_embed_tokens)
        self.layers = nn.ModuleList([
            EncoderLayer(hf_config.d_model, hf_config.encoder_attention_heads, hf_config.encoder_ffn_dim,
                         hf_config.activation_function, pre_norm)
            for _ in range(hf_config.encoder_layers)])
        self.layer_norm = nn.LayerNorm(hf_config.d_model) if final_layer_norm else None

    def forward(self, shared: Optional[nn.Embedding], input_ids: torch.Tensor, positions: torch.Tensor,
                attn_metadata: AttentionMetadata) -> torch.Tensor:
        hidden_states = self.embed(shared, input_ids, positions)
        for layer in self.layers:
            hidden_states = layer(hidden_states, attn_metadata)
        if self.layer_norm is not None:
            hidden_states = self.layer_norm(hidden_states)
        return hidden_states


class BartDecoder(_EmbeddingStack):
    def __init__(self, hf_config, pre_norm: bool, final_layer_norm: bool, own_embed_tokens: bool) -> None:
        super().__init__(hf_config, own_embed_tokens)
        self.layers = nn.ModuleList([
            DecoderLayer(hf_config.d_model, hf_config.decoder_attention_heads, hf_config.decoder_ffn_dim,
                         hf_config.activation_function, pre_norm)
            for _ in range(hf_config.decoder_layers)])
        self.layer_norm = nn.LayerNorm(hf_config.d_model) if final_layer_norm else None

    def forward(self, shared: Optional[nn.Embedding], input_ids: torch.Tensor, positions: torch.Tensor,
                encoder_hidden_states: Optional[torch.Tensor], kv_caches: List[Optional[KVCache]],
                attn_metadata: AttentionMetadata) -> torch.Tensor:
        hidden_states = self.embed(shared, input_ids, positions)
        for layer, kv_cache in zip(self.layers, kv_caches):
            hidden_states = layer(hidden_states, encoder_hidden_states, kv_cache, attn_metadata)
        if self.layer_norm is not None:
            hidden_states = self.layer_norm(hidden_states)
        return hidden_states


class BartModel(nn.Module):
    def __init__(self, hf_config, pre_norm: bool, final_layer_norm: bool, tied: bool) -> None:
        super().__init__()
        self.shared = nn.Embedding(hf_config.vocab_size, hf_config.d_model) if tied else None
        self.encoder = BartEncoder(hf_config, pre_norm, final_layer_norm, own_embed_tokens=not tied)
        self.decoder = BartDecoder(hf_config, pre_norm, final_layer_norm, own_embed_tokens=not tied)


class BartForConditionalGeneration(EncoderDecoderForGeneration):
    """BART for generation. forward() returns decoder hidden states [num_tokens, d_model]; the encoder runs only
    in steps with ``attn_metadata.encoder`` (prefills), on the prefill requests' encoder prompts concatenated."""

    pre_norm = False            # mBART: True
    final_layer_norm = False    # mBART: True
    model_class = BartModel     # the sinusoidal families (models/sinusoidal_seq2seq.py) swap the embeddings

    def __init__(self, hf_config) -> None:
        super().__init__()
        self.config = hf_config
        self.tie_word_embeddings = self.ties_all_embeddings(hf_config)
        self.model = self.model_class(hf_config, self.pre_norm, self.final_layer_norm, self.tie_word_embeddings)
        # a parameter (not a buffer) so that the strict loader sees it; absent from a checkpoint it stays zero
        self.final_logits_bias = nn.Parameter(torch.zeros(1, hf_config.vocab_size), requires_grad=False)
        self.lm_head = None if self.tie_word_embeddings else nn.Linear(hf_config.d_model, hf_config.vocab_size,
                                                                       bias=False)

    @staticmethod
    def ties_all_embeddings(hf_config) -> bool:
        """Whether encoder, decoder and lm_head share ``model.shared`` (else each has its own weight)."""
        return getattr(hf_config, "tie_word_embeddings", True)

    # ------------------------------------------------------------------------------------------------ forward
    @property
    def num_decoder_layers(self) -> int:
        return len(self.model.decoder.layers)

    def encode(self, attn_metadata: AttentionMetadata, encoder_input_ids: Optional[torch.Tensor] = None,
               encoder_positions: Optional[torch.Tensor] = None, **unused_inputs) -> torch.Tensor:
        """Encoder output [num_encoder_tokens, d_model] for the prefill requests' encoder prompts."""
        if encoder_input_ids is None:
            raise ValueError("this step runs the encoder (attn_metadata.encoder is set) but no "
                             "encoder_input_ids were given")
        if encoder_positions is None:
            encoder_positions = segment_positions(attn_metadata, encoder_input_ids.device)
        return self.model.encoder(self.model.shared, encoder_input_ids, encoder_positions, attn_metadata)

    def decode(self, input_ids, positions, encoder_hidden_states, caches, attn_metadata) -> torch.Tensor:
        return self.model.decoder(self.model.shared, input_ids, positions, encoder_hidden_states, caches,
                                  attn_metadata)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        # The bias goes into the projection's own pass (int8 rescale, the packed layer's bias), else into its fresh
        # output in place: a [rows, vocab] pass and tensor fewer.
        if isinstance(self.lm_head, (Int8Linear, PackedLinear)):
            return self.lm_head(hidden_states, addend=self.final_logits_bias)
        if self.lm_head is None:
            logits = F.linear(hidden_states, self.tied_lm_head_weight())
        else:
            logits = self.lm_head(hidden_states)
        return logits.add_(self.final_logits_bias).float()

    def tied_lm_head_weight(self) -> Optional[torch.Tensor]:
        """The embedding matrix the logits projection reuses (None when lm_head has its own weight)."""
        return self.model.shared.weight if self.lm_head is None else None

    def set_lm_head(self, head: nn.Module) -> None:
        """Give the logits projection its own module (an int8 copy of the tied weight, models/int8.py)."""
        self.lm_head = head

    # -------------------------------------------------------------------------------------------- weights
    def load_weights(self, weights: Iterable[Tuple[str, torch.Tensor]]) -> None:
        if self.tie_word_embeddings:
            aliases = {"model.encoder.embed_tokens.weight": "model.shared.weight",
                       "model.decoder.embed_tokens.weight": "model.shared.weight",
                       "lm_head.weight": "model.shared.weight"}
            ignore = ()
        else:
            aliases, ignore = {}, ("model.shared.weight",)   # untied: unused by transformers' forward too
        load_hf_weights(self, weights, aliases=aliases, allow_missing=("final_logits_bias",), ignore=ignore,
                        prefix_fallback="model.")

    def kv_cache_spec(self) -> Tuple[int, int, int]:
        cfg = self.config
        return cfg.decoder_layers, cfg.decoder_attention_heads, cfg.d_model // cfg.decoder_attention_heads


class MBartForConditionalGeneration(BartForConditionalGeneration):
    """mBART: pre-norm layers plus a final layer_norm after the encoder and after the decoder."""

    pre_norm = True
    final_layer_norm = True
