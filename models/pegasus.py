"""Pegasus (``PegasusForConditionalGeneration``): pre-norm BART layers with Marian-layout sinusoidal positions.

Token embeddings scaled by sqrt(d_model) when ``scale_embedding``, a final ``layer_norm`` after the encoder and
the decoder, ``final_logits_bias``, lm_head tied to ``model.shared``; the decoder starts from
``decoder_start_token_id`` (= pad). Checkpoints store the position tables: they are checked, not loaded.
"""
from __future__ import annotations

from seq2seq_engine.models.sinusoidal_seq2seq import SinusoidalForConditionalGeneration


class PegasusForConditionalGeneration(SinusoidalForConditionalGeneration):
    pre_norm = True
    final_layer_norm = True
