"""CTranslate2 TransformerSpec variables of the BART-like families (BART, mBART, Marian, M2M100/NLLB, Pegasus) →
HF transformers tensors and config fields.

The inverse of CTranslate2's BART-family loaders: fused self-attention q,k,v (`self_attention/linear_0`) and cross
k,v (`attention/linear_1`) are split on the output dim; learned (m)BART position tables get back the two unused
rows of HF's offset; Marian's `<pad>` row, which the converter removes, comes back as a zero embedding row (the
decoder starts from it, as CTranslate2's `start_from_zero_embedding` does) whose logit is -inf (CTranslate2 cannot
produce it). Sinusoidal tables (Marian, M2M100) are recomputed by HF and not written; Pegasus stores its own.
"""
from __future__ import annotations

import math
from typing import Dict, List, Tuple

import torch

from seq2seq_engine.model_loader.ct2.text_spec import ACTIVATIONS, TextSpec

ARCHITECTURES = {"bart": ("BartForConditionalGeneration", "bart"),
                 "mbart": ("MBartForConditionalGeneration", "mbart"),
                 "marian": ("MarianMTModel", "marian"),
                 "m2m100": ("M2M100ForConditionalGeneration", "m2m_100"),
                 "pegasus": ("PegasusForConditionalGeneration", "pegasus")}
LEARNED_POSITION_OFFSET = 2
_HAS_LOGITS_BIAS = ("bart", "mbart", "marian", "pegasus")
_POSITIONS_IN_CHECKPOINT = ("bart", "mbart", "pegasus")
_LINEARS = {"self_attention/linear_1": "self_attn.out_proj", "attention/linear_0": "encoder_attn.q_proj",
            "attention/linear_2": "encoder_attn.out_proj", "ffn/linear_0": "fc1", "ffn/linear_1": "fc2"}
_SPLIT_LINEARS = {"self_attention/linear_0": ("self_attn", ("q_proj", "k_proj", "v_proj")),
                  "attention/linear_1": ("encoder_attn", ("k_proj", "v_proj"))}
_NORMS = {"self_attention/layer_norm": "self_attn_layer_norm", "attention/layer_norm": "encoder_attn_layer_norm",
          "ffn/layer_norm": "final_layer_norm"}
_NORM_PARAMS = {"gamma": "weight", "beta": "bias"}


def _layer_tensors(spec: TextSpec, side: str, index: int) -> Dict[str, torch.Tensor]:
    """HF tensors of one encoder or decoder layer."""
    ct2_prefix, hf_prefix = f"{side}/layer_{index}/", f"model.{side}.layers.{index}."
    state: Dict[str, torch.Tensor] = {}
    for name, tensor in spec.variables.items():
        if not name.startswith(ct2_prefix):
            continue
        module, _, param = name[len(ct2_prefix):].rpartition("/")
        if module in _NORMS and param in _NORM_PARAMS:
            state[hf_prefix + f"{_NORMS[module]}.{_NORM_PARAMS[param]}"] = tensor
        elif module in _LINEARS and param in ("weight", "bias"):
            state[hf_prefix + f"{_LINEARS[module]}.{param}"] = tensor
        elif module in _SPLIT_LINEARS and param in ("weight", "bias"):
            parent, parts = _SPLIT_LINEARS[module]
            for part, chunk in zip(parts, tensor.chunk(len(parts), dim=0)):
                state[hf_prefix + f"{parent}.{part}.{param}"] = chunk
        else:
            raise ValueError(f"CTranslate2 {spec.family} variable {name!r} has no HF counterpart")
    return state


def _scale_embedding(spec: TextSpec, d_model: int) -> bool:
    scales = {side: float(spec.scalar(f"{side}/scale_embeddings", 1.0)) for side in ("encoder", "decoder")}
    if len(set(scales.values())) != 1:
        raise ValueError(f"encoder and decoder scale their embeddings differently ({scales}); HF {spec.family} "
                         f"scales both or neither")
    scale = scales["encoder"]
    if abs(scale - math.sqrt(d_model)) < 1e-3:
        return True
    if scale in (0.0, 1.0):  # 0: a boolean "no" from older converters
        return False
    raise ValueError(f"embedding scale {scale} is neither 1 nor sqrt(d_model) = {math.sqrt(d_model):.4f}")


def _activation(spec: TextSpec) -> str:
    ids = {side: int(spec.scalar(f"{side}/activation", 0)) for side in ("encoder", "decoder")}
    if ids["encoder"] != ids["decoder"] or ids["encoder"] not in ACTIVATIONS:
        raise ValueError(f"unsupported CTranslate2 activations {ids} (known ids: {ACTIVATIONS})")
    return ACTIVATIONS[ids["encoder"]]


def _positions(spec: TextSpec, side: str) -> torch.Tensor:
    table = spec.tensor(f"{side}/position_encodings/encodings")
    if spec.family in ("bart", "mbart"):
        padding = torch.zeros(LEARNED_POSITION_OFFSET, table.shape[1], dtype=table.dtype)
        return torch.cat([padding, table])
    return table


def _side_tensors(spec: TextSpec, side: str) -> Dict[str, torch.Tensor]:
    state: Dict[str, torch.Tensor] = {}
    for index in range(spec.num_layers(side)):
        state.update(_layer_tensors(spec, side, index))
    for ct2, hf in (("layer_norm", "layer_norm"), ("layernorm_embedding", "layernorm_embedding")):
        for param, hf_param in _NORM_PARAMS.items():
            if f"{side}/{ct2}/{param}" in spec.variables:
                state[f"model.{side}.{hf}.{hf_param}"] = spec.variables[f"{side}/{ct2}/{param}"]
    if spec.family in _POSITIONS_IN_CHECKPOINT:
        state[f"model.{side}.embed_positions.weight"] = _positions(spec, side)
    return state


def _with_marian_pad(tensor: torch.Tensor, fill: float) -> torch.Tensor:
    """`tensor` with one more row (or element) holding `fill`: Marian's `<pad>`, removed by the converter."""
    extra = torch.full((1, *tensor.shape[1:]), fill, dtype=tensor.dtype)
    return torch.cat([tensor, extra])


def _vocabulary_tensors(spec: TextSpec) -> Tuple[Dict[str, torch.Tensor], bool]:
    """(embedding, LM-head and logits-bias tensors, tied): tied when CTranslate2 stored the encoder embeddings
    and the projection as aliases of the decoder embeddings (equal tensors)."""
    encoder_emb, decoder_emb = spec.tensor("encoder/embeddings_0/weight"), spec.tensor("decoder/embeddings/weight")
    projection = spec.tensor("decoder/projection/weight")
    bias = spec.variables.get("decoder/projection/bias")
    marian = spec.family == "marian"
    if marian:
        encoder_emb, decoder_emb = _with_marian_pad(encoder_emb, 0.0), _with_marian_pad(decoder_emb, 0.0)
        projection = _with_marian_pad(projection, 0.0)
        bias = _with_marian_pad(bias if bias is not None else torch.zeros(projection.shape[0] - 1), -math.inf)
    tied = torch.equal(projection, decoder_emb) and torch.equal(encoder_emb, decoder_emb)
    state = {"model.shared.weight": decoder_emb}
    if not tied:  # HF's untied models keep separate token embeddings per side and an LM head of their own
        state.update({"model.encoder.embed_tokens.weight": encoder_emb,
                      "model.decoder.embed_tokens.weight": decoder_emb, "lm_head.weight": projection})
    if bias is not None and spec.family in _HAS_LOGITS_BIAS:
        state["final_logits_bias"] = bias.reshape(1, -1)
    elif bias is not None and bool(bias.any()):
        raise ValueError(f"HF {spec.family} has no output bias, but the CTranslate2 projection has a nonzero one")
    return state, tied


def bart_like_state_dict(spec: TextSpec) -> Tuple[Dict[str, torch.Tensor], bool]:
    """({HF name: tensor}, tie_word_embeddings) for a BART-like TextSpec."""
    state, tied = _vocabulary_tensors(spec)
    for side in ("encoder", "decoder"):
        state.update(_side_tensors(spec, side))
    return state, tied


def bart_like_config(spec: TextSpec, tied: bool) -> Dict[str, object]:
    """The HF config fields the variables determine (token ids are added by the caller)."""
    embeddings = spec.tensor("decoder/embeddings/weight")
    d_model = embeddings.shape[1]
    heads: List[int] = [int(spec.scalar(f"{side}/num_heads")) for side in ("encoder", "decoder")]
    architecture, model_type = ARCHITECTURES[spec.family]
    vocab_size = embeddings.shape[0] + (1 if spec.family == "marian" else 0)
    config = dict(
        architectures=[architecture], model_type=model_type, vocab_size=vocab_size, d_model=d_model,
        encoder_layers=spec.num_layers("encoder"), decoder_layers=spec.num_layers("decoder"),
        encoder_attention_heads=heads[0], decoder_attention_heads=heads[1],
        encoder_ffn_dim=spec.tensor("encoder/layer_0/ffn/linear_0/weight").shape[0],
        decoder_ffn_dim=spec.tensor("decoder/layer_0/ffn/linear_0/weight").shape[0],
        max_position_embeddings=spec.tensor("encoder/position_encodings/encodings").shape[0],
        activation_function=_activation(spec), scale_embedding=_scale_embedding(spec, d_model),
        tie_word_embeddings=tied, is_encoder_decoder=True, dropout=0.0, attention_dropout=0.0,
        activation_dropout=0.0, forced_bos_token_id=None, forced_eos_token_id=None)
    if spec.family == "marian":
        config.update(decoder_vocab_size=vocab_size, share_encoder_decoder_embeddings=True)
    return config
