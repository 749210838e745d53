"""Marian (OPUS-MT, ``MarianMTModel``): post-norm BART layers with Marian sinusoidal positions (no offset).

Token embeddings scaled by sqrt(d_model) when ``scale_embedding``, no ``layernorm_embedding``, no final layer
norms, ``final_logits_bias``; the decoder starts from ``decoder_start_token_id`` (= pad). Embeddings:
``share_encoder_decoder_embeddings`` (the norm) ties encoder, decoder and lm_head to ``model.shared``; without it
the encoder and decoder have their own tables and lm_head is tied to the decoder's (or its own weight when
``tie_word_embeddings`` is False). A separate target vocabulary (``decoder_vocab_size != vocab_size``) is refused.
"""
from __future__ import annotations

from typing import Iterable, Optional, Tuple

import torch

from seq2seq_engine.models.encoder_decoder_utils import load_hf_weights
from seq2seq_engine.models.sinusoidal_seq2seq import SinusoidalForConditionalGeneration


class MarianMTModel(SinusoidalForConditionalGeneration):
    pre_norm = False
    final_layer_norm = False

    def __init__(self, hf_config) -> None:
        shares = getattr(hf_config, "share_encoder_decoder_embeddings", True)
        decoder_vocab_size = getattr(hf_config, "decoder_vocab_size", None) or hf_config.vocab_size
        if decoder_vocab_size != hf_config.vocab_size:
            raise ValueError(f"Marian with a separate target vocabulary (decoder_vocab_size {decoder_vocab_size} != "
                             f"vocab_size {hf_config.vocab_size}) is not supported")
        super().__init__(hf_config)
        self.head_tied_to_decoder = not shares and getattr(hf_config, "tie_word_embeddings", True)
        if self.head_tied_to_decoder:
            self.lm_head = None

    @staticmethod
    def ties_all_embeddings(hf_config) -> bool:
        return (getattr(hf_config, "share_encoder_decoder_embeddings", True)
                and getattr(hf_config, "tie_word_embeddings", True))

    def tied_lm_head_weight(self) -> Optional[torch.Tensor]:
        if self.lm_head is not None:
            return None
        if self.head_tied_to_decoder:
            return self.model.decoder.embed_tokens.weight
        return self.model.shared.weight

    def load_weights(self, weights: Iterable[Tuple[str, torch.Tensor]]) -> None:
        if not self.head_tied_to_decoder:
            super().load_weights(weights)
            return
        load_hf_weights(self, self._without_position_tables(weights),
                        aliases={"lm_head.weight": "model.decoder.embed_tokens.weight"},
                        allow_missing=("final_logits_bias",), prefix_fallback="model.")
