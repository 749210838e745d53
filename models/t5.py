"""T5, mT5, Flan-T5 (v1.1) and UMT5 on the engine's Attention layer: pre-norm blocks with RMS layer norms, no
biases, unscaled attention with a bucketed relative position bias (computed from positions once per forward pass,
as prefill masks and a paged-decode bias, and handed to every block), ReLU or gated-GELU feed-forward.

T5/mT5 keep one bias table per stack, in its first block, shared by every block; UMT5 gives every block its own.
With ``scale_decoder_outputs`` (HF's reading of ``tie_word_embeddings``) the decoder output is scaled by
``d_model ** -0.5`` before the logits projection; the projection is ``lm_head.weight`` when the checkpoint has one,
else the shared embeddings.
"""
from __future__ import annotations

from types import MappingProxyType
from typing import Iterable, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from seq2seq_engine.attention import AttentionMetadata, AttentionType
from seq2seq_engine.attention.position_bias import StepPositionBias, StepRelativeBuckets
from seq2seq_engine.kernels import reshape_and_cache
from seq2seq_engine.models.encoder_decoder_utils import EncoderDecoderForGeneration, KVCache, load_hf_weights
from seq2seq_engine.models.t5_layers import T5LayerCrossAttention, T5LayerFF, T5LayerNorm, T5LayerSelfAttention

_FLOAT16_REASON = ("T5 activations overflow float16 (HF clamps them, which changes the results); use "
                   "dtype='bfloat16' or 'float32'")


class T5Block(nn.Module):
    """Self-attention, cross-attention (decoder only) and feed-forward, each pre-normed with a residual."""

    def __init__(self, hf_config, is_decoder: bool, has_bias: bool) -> None:
        super().__init__()
        attn_type = AttentionType.DECODER if is_decoder else AttentionType.ENCODER
        layers = [T5LayerSelfAttention(hf_config, attn_type, has_bias)]
        if is_decoder:
            layers.append(T5LayerCrossAttention(hf_config))
        layers.append(T5LayerFF(hf_config))
        self.layer = nn.ModuleList(layers)

    def forward(self, hidden_states: torch.Tensor, residual: Optional[torch.Tensor],
                position_bias: StepPositionBias, encoder_hidden_states: Optional[torch.Tensor],
                kv_cache: Optional[KVCache], attn_metadata: AttentionMetadata,
                state_cache: Optional[KVCache] = None) -> Tuple[torch.Tensor, torch.Tensor]:
        """(feed-forward output, residual stream before it); ``residual`` is None for the first block."""
        hidden_states, residual = self.layer[0](hidden_states, residual, kv_cache, attn_metadata, position_bias)
        if len(self.layer) == 3:
            hidden_states, residual = self.layer[1](hidden_states, residual, encoder_hidden_states, kv_cache,
                                                    attn_metadata, state_cache)
        return self.layer[-1](hidden_states, residual)


class T5Stack(nn.Module):
    """The encoder or the decoder: blocks and a final layer norm over already-embedded tokens."""

    def __init__(self, hf_config, is_decoder: bool, num_layers: int, bias_per_layer: bool) -> None:
        super().__init__()
        self.bias_per_layer = bias_per_layer
        self.is_decoder = is_decoder
        self.block = nn.ModuleList([T5Block(hf_config, is_decoder, has_bias=bias_per_layer or index == 0)
                                    for index in range(num_layers)])
        self.final_layer_norm = T5LayerNorm(hf_config.d_model, hf_config.layer_norm_epsilon)

    def forward(self, hidden_states: torch.Tensor, encoder_hidden_states: Optional[torch.Tensor],
                kv_caches: List[Optional[KVCache]], attn_metadata: AttentionMetadata) -> torch.Tensor:
        residual = None
        state_cache = self.encoder_state_cache(encoder_hidden_states, kv_caches, attn_metadata)
        for block, kv_cache, bias in zip(self.block, kv_caches, self.step_position_biases()):
            hidden_states, residual = block(hidden_states, residual, bias, encoder_hidden_states, kv_cache,
                                            attn_metadata, state_cache)
        return self.final_layer_norm(hidden_states, residual)[0]

    def encoder_state_cache(self, encoder_hidden_states: Optional[torch.Tensor],
                            kv_caches: List[Optional[KVCache]], attn_metadata: AttentionMetadata
                            ) -> Optional[KVCache]:
        """The decoder's encoder-state cache: the first layer's K cache viewed as one d_model row per slot, its
        cross slots holding every request's encoder states (written here, in the step that ran the encoder),
        read by every layer's cross-attention (T5CrossAttention). None where cross-attention keeps K/V per layer:
        the encoder stack, no cache (a profiling run), a non-contiguous cache, or a layer that cannot."""
        if not self.is_decoder or not kv_caches or kv_caches[0] is None:
            return None
        cross = self.block[0].layer[1].EncDecAttention
        key_cache = kv_caches[0][0]
        if not cross.attends_encoder_states() or not key_cache.is_contiguous():
            return None
        states = key_cache.view(*key_cache.shape[:2], 1, cross.d_model)
        if encoder_hidden_states is not None:
            rows = encoder_hidden_states.view(-1, 1, cross.d_model)
            # the one row goes in as both "key" and "value": the two writes land on the same slots
            reshape_and_cache(rows, rows, states, states, attn_metadata.cross.cross_slot_mapping)
        return states, states

    def step_position_biases(self) -> List[StepPositionBias]:
        """Each block's position bias for one forward pass: the bucket indices are computed once for the stack,
        and (T5/mT5) the masks and decode bias of the one shared table once for all blocks."""
        first = self.block[0].layer[0].SelfAttention
        buckets = StepRelativeBuckets(first.buckets)
        if not self.bias_per_layer:
            return [StepPositionBias(buckets, first.lookup)] * len(self.block)
        return [StepPositionBias(buckets, block.layer[0].SelfAttention.lookup) for block in self.block]


class T5ForConditionalGeneration(EncoderDecoderForGeneration):
    """T5 for generation. forward() returns decoder hidden states [num_tokens, d_model] (already scaled when the
    head is tied the T5 v1.0 way); the encoder runs only in prefill steps, on their encoder prompts concatenated."""

    bias_per_layer = False      # UMT5: True
    refused_dtypes = MappingProxyType({torch.float16: _FLOAT16_REASON})

    def __init__(self, hf_config) -> None:
        super().__init__()
        self.config = hf_config
        self.shared = nn.Embedding(hf_config.vocab_size, hf_config.d_model)
        num_decoder_layers = getattr(hf_config, "num_decoder_layers", None) or hf_config.num_layers
        self.encoder = T5Stack(hf_config, False, hf_config.num_layers, self.bias_per_layer)
        self.decoder = T5Stack(hf_config, True, num_decoder_layers, self.bias_per_layer)
        # dropped by load_weights when the checkpoint has no lm_head.weight (a head tied to `shared`)
        self.lm_head: Optional[nn.Module] = nn.Linear(hf_config.d_model, hf_config.vocab_size, bias=False)
        self.output_scale = hf_config.d_model ** -0.5 if self.scales_decoder_output(hf_config) else 1.0

    @staticmethod
    def scales_decoder_output(hf_config) -> bool:
        """HF's rule: transformers 5 stores ``scale_decoder_outputs``; older configs mean it by a
        tie_word_embeddings that is not false (T5 v1.0 ties and scales, v1.1 / UMT5 checkpoints do neither)."""
        if hasattr(hf_config, "scale_decoder_outputs"):
            return bool(hf_config.scale_decoder_outputs)
        return getattr(hf_config, "tie_word_embeddings", True) is not False

    @property
    def num_decoder_layers(self) -> int:
        return len(self.decoder.block)

    def encode(self, attn_metadata: AttentionMetadata, encoder_input_ids: Optional[torch.Tensor] = None,
               **unused_inputs) -> torch.Tensor:
        """Encoder output [num_encoder_tokens, d_model]; positions come from the encoder bias' segments."""
        if encoder_input_ids is None:
            raise ValueError("this step runs the encoder (attn_metadata.encoder is set) but no "
                             "encoder_input_ids were given")
        return self.encoder(self.shared(encoder_input_ids), None, [None] * len(self.encoder.block), attn_metadata)

    def decode(self, input_ids, positions, encoder_hidden_states, caches, attn_metadata) -> torch.Tensor:
        hidden_states = self.decoder(self.shared(input_ids), encoder_hidden_states, caches, attn_metadata)
        return hidden_states * self.output_scale if self.output_scale != 1.0 else hidden_states

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        if self.lm_head is None:
            return F.linear(hidden_states, self.shared.weight).float()
        return self.lm_head(hidden_states).float()

    def tied_lm_head_weight(self) -> Optional[torch.Tensor]:
        """The embedding matrix the logits projection reuses (None when lm_head has its own weight)."""
        return self.shared.weight if self.lm_head is None else None

    def set_lm_head(self, head: nn.Module) -> None:
        """Give the logits projection its own module (an int8 copy of the tied weight, models/int8.py)."""
        self.lm_head = head

    def load_weights(self, weights: Iterable[Tuple[str, torch.Tensor]]) -> None:
        """Strict load of HF names; ``encoder/decoder.embed_tokens`` are ``shared``; without ``lm_head.weight`` in
        the checkpoint the head is tied to ``shared``."""
        seen = set()

        def recorded():
            for name, tensor in weights:
                seen.add(name)
                yield name, tensor

        aliases = {"encoder.embed_tokens.weight": "shared.weight", "decoder.embed_tokens.weight": "shared.weight"}
        load_hf_weights(self, recorded(), aliases=aliases, allow_missing=("lm_head.weight",))
        if "lm_head.weight" not in seen:
            self.lm_head = None

    def kv_cache_spec(self) -> Tuple[int, int, int]:
        return self.num_decoder_layers, self.config.num_heads, self.config.d_kv


class MT5ForConditionalGeneration(T5ForConditionalGeneration):
    """mT5: T5 v1.1's architecture (gated-GELU, untied head) with a larger vocabulary; its decoder output is never
    scaled (transformers 5 forces its tie_word_embeddings to True and does not scale; released mT5 checkpoints
    are untied)."""

    @staticmethod
    def scales_decoder_output(hf_config) -> bool:
        return False


class UMT5ForConditionalGeneration(T5ForConditionalGeneration):
    """UMT5: every block has its own relative position bias table."""

    bias_per_layer = True
