"""CTranslate2 TransformerSpec variables of T5 / mT5 / UMT5 → HF transformers tensors and config fields.

The inverse of CTranslate2's T5 loader: fused q,k,v and cross k,v are split; RMS norms have only `gamma`; the
relative attention bias lives in layer 0 (T5, mT5: later layers alias it) or in every layer (UMT5). The head is
tied when the projection equals the embeddings; `decoder/scale_outputs` (d_model^-0.5) becomes HF's
`scale_decoder_outputs`, independently: CTranslate2 4.8.5's converter sets it whenever the transformers config says
`tie_word_embeddings`, which transformers 5 always does, so a Flan-T5 converted there carries an untied head and
the scale (greedy tokens are unaffected by it; probabilities are).
"""
from __future__ import annotations

from typing import Dict, Tuple

import torch

from seq2seq_engine.model_loader.ct2.text_spec import ACTIVATIONS, TextSpec

ARCHITECTURES = {"t5": ("T5ForConditionalGeneration", "t5"), "umt5": ("UMT5ForConditionalGeneration", "umt5")}


def _attention(spec: TextSpec, ct2: str, hf: str, parts: Tuple[str, ...], fused: str) -> Dict[str, torch.Tensor]:
    """q/k/v (or k/v) of the fused projection `fused`, plus o, of one attention block."""
    state = {f"{hf}.{part}.weight": chunk
             for part, chunk in zip(parts, spec.tensor(f"{ct2}/{fused}/weight").chunk(len(parts), dim=0))}
    out = "linear_1" if fused == "linear_0" and len(parts) == 3 else "linear_2"
    state[f"{hf}.o.weight"] = spec.tensor(f"{ct2}/{out}/weight")
    scale = spec.scalar(f"{ct2}/queries_scale", 1.0)
    if abs(scale - 1.0) > 1e-6:
        raise ValueError(f"{ct2}/queries_scale = {scale}; HF T5 attention does not scale queries")
    return state


def _layer(spec: TextSpec, side: str, index: int, glu: bool) -> Dict[str, torch.Tensor]:
    ct2, hf = f"{side}/layer_{index}", f"{side}.block.{index}.layer"
    state = _attention(spec, f"{ct2}/self_attention", f"{hf}.0.SelfAttention", ("q", "k", "v"), "linear_0")
    state[f"{hf}.0.layer_norm.weight"] = spec.tensor(f"{ct2}/self_attention/layer_norm/gamma")
    bias_name = f"{ct2}/self_attention/relative_attention_bias"
    if bias_name in spec.variables and (index == 0 or spec.family == "umt5"):
        state[f"{hf}.0.SelfAttention.relative_attention_bias.weight"] = spec.variables[bias_name]
    ffn = 1
    if side == "decoder":
        state.update(_attention(spec, f"{ct2}/attention", f"{hf}.1.EncDecAttention", ("q",), "linear_0"))
        state.update({f"{hf}.1.EncDecAttention.{part}.weight": chunk for part, chunk in
                      zip(("k", "v"), spec.tensor(f"{ct2}/attention/linear_1/weight").chunk(2, dim=0))})
        state[f"{hf}.1.layer_norm.weight"] = spec.tensor(f"{ct2}/attention/layer_norm/gamma")
        ffn = 2
    dense = f"{hf}.{ffn}.DenseReluDense"
    if glu:
        state[f"{dense}.wi_0.weight"] = spec.tensor(f"{ct2}/ffn/linear_0/weight")
        state[f"{dense}.wi_1.weight"] = spec.tensor(f"{ct2}/ffn/linear_0_noact/weight")
    else:
        state[f"{dense}.wi.weight"] = spec.tensor(f"{ct2}/ffn/linear_0/weight")
    state[f"{dense}.wo.weight"] = spec.tensor(f"{ct2}/ffn/linear_1/weight")
    state[f"{hf}.{ffn}.layer_norm.weight"] = spec.tensor(f"{ct2}/ffn/layer_norm/gamma")
    return state


def _refuse_biases(spec: TextSpec) -> None:
    biased = [name for name, tensor in spec.variables.items()
              if name.endswith(("/bias", "/beta")) and bool(tensor.any())]
    if biased:
        raise ValueError(f"HF T5 has no biases, but the CTranslate2 model has nonzero {biased[:5]}")


def t5_state_dict(spec: TextSpec) -> Tuple[Dict[str, torch.Tensor], bool]:
    """({HF name: tensor}, tie_word_embeddings) for a T5/mT5/UMT5 TextSpec."""
    _refuse_biases(spec)
    embeddings = spec.tensor("encoder/embeddings_0/weight")
    if not torch.equal(embeddings, spec.tensor("decoder/embeddings/weight")):
        raise ValueError("the T5 encoder and decoder embeddings differ; HF T5 shares them")
    glu = "encoder/layer_0/ffn/linear_0_noact/weight" in spec.variables
    state = {"shared.weight": embeddings}
    projection = spec.tensor("decoder/projection/weight")
    tied = torch.equal(projection, embeddings)
    if not tied:
        state["lm_head.weight"] = projection
    for side in ("encoder", "decoder"):
        for index in range(spec.num_layers(side)):
            state.update(_layer(spec, side, index, glu))
        state[f"{side}.final_layer_norm.weight"] = spec.tensor(f"{side}/layer_norm/gamma")
    return state, tied


def _feed_forward_proj(activation: str, glu: bool) -> str:
    """HF's spelling: "gated-gelu" means a gated gelu_new (tanh) FFN."""
    if glu:
        return "gated-gelu" if activation == "gelu_new" else f"gated-{activation}"
    return activation


def _output_scale(spec: TextSpec, d_model: int) -> bool:
    """Whether the decoder output is scaled by d_model^-0.5 before the head (HF's scale_decoder_outputs)."""
    if "decoder/scale_outputs" not in spec.variables:
        return False
    scale = float(spec.scalar("decoder/scale_outputs"))
    if abs(scale - d_model ** -0.5) > 1e-6:
        raise ValueError(f"decoder/scale_outputs = {scale}; HF T5 scales by d_model^-0.5 = {d_model ** -0.5:.6f} or "
                         f"not at all")
    return True


def t5_config(spec: TextSpec, tied: bool) -> Dict[str, object]:
    """The HF config fields the variables determine (token ids are added by the caller)."""
    heads = int(spec.scalar("encoder/num_heads"))
    if int(spec.scalar("decoder/num_heads")) != heads:
        raise ValueError("HF T5 has one head count for the encoder and the decoder")
    embeddings = spec.tensor("encoder/embeddings_0/weight")
    activation = ACTIVATIONS.get(int(spec.scalar("encoder/activation", 0)))
    glu = "encoder/layer_0/ffn/linear_0_noact/weight" in spec.variables
    if activation is None:
        raise ValueError(f"unsupported CTranslate2 activation id {spec.scalar('encoder/activation')}")
    bias = spec.tensor("encoder/layer_0/self_attention/relative_attention_bias")
    architecture, model_type = ARCHITECTURES[spec.family]
    return dict(
        architectures=[architecture], model_type=model_type, vocab_size=embeddings.shape[0],
        d_model=embeddings.shape[1], d_kv=spec.tensor("encoder/layer_0/self_attention/linear_0/weight").shape[0]
        // 3 // heads, d_ff=spec.tensor("encoder/layer_0/ffn/linear_1/weight").shape[1], num_heads=heads,
        num_layers=spec.num_layers("encoder"), num_decoder_layers=spec.num_layers("decoder"),
        relative_attention_num_buckets=bias.shape[0],
        relative_attention_max_distance=int(spec.scalar("encoder/layer_0/self_attention/"
                                                        "relative_attention_max_distance", 128)),
        feed_forward_proj=_feed_forward_proj(activation, glu), tie_word_embeddings=tied,
        scale_decoder_outputs=_output_scale(spec, embeddings.shape[1]),
        is_encoder_decoder=True, dropout_rate=0.0)
