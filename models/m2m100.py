"""M2M100 and NLLB (``M2M100ForConditionalGeneration``): pre-norm BART layers with fairseq sinusoidal positions.

Positions start at padding_idx + 1 (offset 2 for the usual pad id 1) and padding tokens get a zero vector
(models/sinusoidal.py); token embeddings scaled by sqrt(d_model) when ``scale_embedding``; a final ``layer_norm``
after the encoder and the decoder; lm_head tied to ``model.shared``; no ``final_logits_bias`` (it stays zero).
The decoder starts from ``decoder_start_token_id`` (= eos, 2) and the target language code follows it, forced as
the first generated token (``forced_bos_token_id``) or given as the decoder prompt.
"""
from __future__ import annotations

from seq2seq_engine.models.sinusoidal_seq2seq import FairseqSinusoidalModel, SinusoidalForConditionalGeneration


class M2M100ForConditionalGeneration(SinusoidalForConditionalGeneration):
    pre_norm = True
    final_layer_norm = True
    model_class = FairseqSinusoidalModel
