"""The BART-shaped encoder/decoder with fixed sinusoidal positions that Marian, M2M100/NLLB and Pegasus share.

Token embeddings (scaled by sqrt(d_model) when ``config.scale_embedding``) + sinusoidal positions
(models/sinusoidal.py), no ``layernorm_embedding``, the shared encoder/decoder layers, and a final ``layer_norm``
after the encoder and the decoder for the pre-norm families. Generation, logits (with ``final_logits_bias``),
the int8 hooks and strict loading come from BartForConditionalGeneration; position tables that a checkpoint
stores (Pegasus saves them) are checked against the computed ones and not loaded.
"""
from __future__ import annotations

from typing import Iterable, Iterator, List, Optional, Tuple

import torch
from torch import nn

from seq2seq_engine.attention import AttentionMetadata
from seq2seq_engine.models.bart import BartForConditionalGeneration
from seq2seq_engine.models.encoder_decoder_utils import DecoderLayer, EncoderLayer, KVCache, embed_scale
from seq2seq_engine.models.sinusoidal import SinusoidalPositions

_POSITION_TABLE_NAMES = ("embed_positions.weight", "embed_positions.weights")


class _SinusoidalStack(nn.Module):
    """Scaled token embeddings + sinusoidal positions, the layers, an optional final layer_norm."""

    def __init__(self, hf_config, layers: List[nn.Module], final_layer_norm: bool, own_embed_tokens: bool,
                 positions: SinusoidalPositions) -> None:
        super().__init__()
        self.embed_scale = embed_scale(hf_config)
        self.embed_tokens = nn.Embedding(hf_config.vocab_size, hf_config.d_model) if own_embed_tokens else None
        self.embed_positions = positions
        self.layers = nn.ModuleList(layers)
        self.layer_norm = nn.LayerNorm(hf_config.d_model) if final_layer_norm else None

    def embed(self, shared: Optional[nn.Embedding], input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        hidden_states = (self.embed_tokens if self.embed_tokens is not None else shared)(input_ids)
        if self.embed_scale != 1.0:
            hidden_states = hidden_states * self.embed_scale
        return hidden_states + self.embed_positions(positions, input_ids).to(hidden_states.dtype)

    def finish(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return hidden_states if self.layer_norm is None else self.layer_norm(hidden_states)


class SinusoidalEncoder(_SinusoidalStack):
    def forward(self, shared: Optional[nn.Embedding], input_ids: torch.Tensor, positions: torch.Tensor,
                attn_metadata: AttentionMetadata) -> torch.Tensor:
        hidden_states = self.embed(shared, input_ids, positions)
        for layer in self.layers:
            hidden_states = layer(hidden_states, attn_metadata)
        return self.finish(hidden_states)


class SinusoidalDecoder(_SinusoidalStack):
    def forward(self, shared: Optional[nn.Embedding], input_ids: torch.Tensor, positions: torch.Tensor,
                encoder_hidden_states: Optional[torch.Tensor], kv_caches: List[Optional[KVCache]],
                attn_metadata: AttentionMetadata) -> torch.Tensor:
        hidden_states = self.embed(shared, input_ids, positions)
        for layer, kv_cache in zip(self.layers, kv_caches):
            hidden_states = layer(hidden_states, encoder_hidden_states, kv_cache, attn_metadata)
        return self.finish(hidden_states)


class SinusoidalModel(nn.Module):
    """``model.shared`` (when tied), ``model.encoder``, ``model.decoder`` with Marian/Pegasus position tables."""

    def __init__(self, hf_config, pre_norm: bool, final_layer_norm: bool, tied: bool) -> None:
        super().__init__()
        cfg = hf_config
        self.shared = nn.Embedding(cfg.vocab_size, cfg.d_model) if tied else None
        encoder_layers = [EncoderLayer(cfg.d_model, cfg.encoder_attention_heads, cfg.encoder_ffn_dim,
                                       cfg.activation_function, pre_norm) for _ in range(cfg.encoder_layers)]
        decoder_layers = [DecoderLayer(cfg.d_model, cfg.decoder_attention_heads, cfg.decoder_ffn_dim,
                                       cfg.activation_function, pre_norm) for _ in range(cfg.decoder_layers)]
        self.encoder = SinusoidalEncoder(cfg, encoder_layers, final_layer_norm, not tied, self.positions(cfg))
        self.decoder = SinusoidalDecoder(cfg, decoder_layers, final_layer_norm, not tied, self.positions(cfg))

    @staticmethod
    def positions(hf_config) -> SinusoidalPositions:
        return SinusoidalPositions.marian(hf_config.max_position_embeddings, hf_config.d_model)


class FairseqSinusoidalModel(SinusoidalModel):
    """The same with M2M100/NLLB position tables (offset padding_idx + 1, zero row for padding tokens)."""

    @staticmethod
    def positions(hf_config) -> SinusoidalPositions:
        return SinusoidalPositions.fairseq(hf_config.max_position_embeddings, hf_config.d_model,
                                           hf_config.pad_token_id)


class SinusoidalForConditionalGeneration(BartForConditionalGeneration):
    """Base of the Marian, M2M100 and Pegasus generation classes (subclasses set the norm and position style)."""

    model_class = SinusoidalModel

    def load_weights(self, weights: Iterable[Tuple[str, torch.Tensor]]) -> None:
        super().load_weights(self._without_position_tables(weights))

    def _without_position_tables(self, weights: Iterable[Tuple[str, torch.Tensor]]
                                 ) -> Iterator[Tuple[str, torch.Tensor]]:
        """The checkpoint minus its stored position tables, each checked against the computed one."""
        for name, tensor in weights:
            if not name.endswith(_POSITION_TABLE_NAMES):
                yield name, tensor
                continue
            parts = name.split(".")
            stack = parts[-3] if len(parts) >= 3 else ""     # [model.]encoder|decoder.embed_positions.weight
            if stack not in ("encoder", "decoder"):
                raise ValueError(f"unexpected checkpoint tensor {name!r} (shape {tuple(tensor.shape)})")
            getattr(self.model, stack).embed_positions.check_checkpoint_table(name, tensor)
