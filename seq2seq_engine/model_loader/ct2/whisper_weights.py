"""CTranslate2 WhisperSpec variables → HF transformers WhisperForConditionalGeneration tensors and dimensions.

Every variable is consumed or rejected: fused self-attention q,k,v (`self_attention/linear_0`) is split on the
output dim; the cross-attention `attention/linear_0` is q and `attention/linear_1` the fused k,v; HF's k_proj has
no bias, and the stored k bias (zero from the converter) is dropped: a bias on k adds the same q·b to every
key's score, which softmax cancels. int8/int16 weights with a `weight_scale` are dequantized (w = q / scale).
"""
from __future__ import annotations

import re
from typing import Dict

import torch

# CTranslate2 ActivationType ids → HF activation names.
_ACTIVATIONS = {0: "relu", 1: "gelu_new", 2: "silu", 3: "gelu", 4: "quick_gelu", 5: "tanh", 6: "sigmoid"}
# Scalars that must hold these values for the HF Whisper architecture.
_REQUIRED_SCALARS = {"decoder/pre_norm": 1, "decoder/scale_embeddings": 0, "decoder/alibi": 0,
                     "decoder/start_from_zero_embedding": 0, "encoder/pre_norm": 1}
# Scalars with no HF counterpart (word alignment is taken from config.json's alignment_heads).
_IGNORED = {"decoder/alignment_heads", "decoder/alignment_layer"}

_LAYER_RE = re.compile(r"^(encoder|decoder)/layer_(\d+)/(.+)$")
_LINEAR_MODULES = {"self_attention/linear_1": "self_attn.out_proj", "attention/linear_0": "encoder_attn.q_proj",
                   "attention/linear_2": "encoder_attn.out_proj", "ffn/linear_0": "fc1", "ffn/linear_1": "fc2"}
_NORM_MODULES = {"self_attention/layer_norm": "self_attn_layer_norm", "attention/layer_norm": "encoder_attn_layer_norm",
                 "ffn/layer_norm": "final_layer_norm"}
_NORM_PARAMS = {"gamma": "weight", "beta": "bias"}


def _scalar(variables: Dict[str, torch.Tensor], name: str) -> int:
    if name not in variables:
        raise ValueError(f"the CTranslate2 Whisper model has no {name!r} variable")
    return int(variables[name].reshape(-1)[0])


def dequantize(variables: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """A copy of `variables` with every `X/weight_scale` applied to `X/weight` (float32) and removed."""
    out = dict(variables)
    for name in [n for n in variables if n.endswith("/weight_scale")]:
        weight_name = name[: -len("_scale")]
        if weight_name not in out:
            raise ValueError(f"{name!r} has no {weight_name!r} to scale")
        scale = out.pop(name).float()
        weight = out[weight_name].float()
        out[weight_name] = weight / (scale.reshape(-1, *([1] * (weight.dim() - 1))) if scale.dim() else scale)
    return out


def whisper_dims(variables: Dict[str, torch.Tensor], aliases: Dict[str, str]) -> Dict[str, object]:
    """The WhisperConfig fields that the variables determine."""
    def layers(side: str) -> int:
        indices = {int(m.group(2)) for m in map(_LAYER_RE.match, variables) if m and m.group(1) == side}
        if indices != set(range(len(indices))):
            raise ValueError(f"{side} layer indices are not contiguous: {sorted(indices)}")
        return len(indices)

    for name in ("encoder/conv1/weight", "decoder/embeddings/weight", "encoder/position_encodings/encodings",
                 "decoder/position_encodings/encodings", "encoder/layer_0/ffn/linear_0/weight",
                 "decoder/layer_0/ffn/linear_0/weight"):
        if name not in variables:
            raise ValueError(f"not a CTranslate2 Whisper model: no {name!r} variable")
    activation = _scalar(variables, "decoder/activation") if "decoder/activation" in variables else 3
    if activation not in _ACTIVATIONS:
        raise ValueError(f"unknown CTranslate2 activation id {activation}")
    tied = aliases.get("decoder/projection/weight") == "decoder/embeddings/weight" or \
        "decoder/projection/weight" not in variables
    embeddings = variables["decoder/embeddings/weight"]
    return dict(
        vocab_size=embeddings.shape[0], d_model=embeddings.shape[1],
        num_mel_bins=variables["encoder/conv1/weight"].shape[1],
        encoder_layers=layers("encoder"), decoder_layers=layers("decoder"),
        encoder_attention_heads=_scalar(variables, "encoder/num_heads"),
        decoder_attention_heads=_scalar(variables, "decoder/num_heads"),
        encoder_ffn_dim=variables["encoder/layer_0/ffn/linear_0/weight"].shape[0],
        decoder_ffn_dim=variables["decoder/layer_0/ffn/linear_0/weight"].shape[0],
        max_source_positions=variables["encoder/position_encodings/encodings"].shape[0],
        max_target_positions=variables["decoder/position_encodings/encodings"].shape[0],
        activation_function=_ACTIVATIONS[activation], tie_word_embeddings=tied, scale_embedding=False)


def ct2_to_hf_state_dict(variables: Dict[str, torch.Tensor], aliases: Dict[str, str],
                         dtype: torch.dtype = torch.float32) -> Dict[str, torch.Tensor]:
    """{HF name: tensor (fresh, contiguous, `dtype`)} for every weight of a CTranslate2 WhisperSpec model."""
    variables = dequantize(variables)
    state: Dict[str, torch.Tensor] = {}

    def put(hf_name: str, tensor: torch.Tensor) -> None:
        state[hf_name] = tensor.to(dtype=dtype, copy=True).contiguous()

    for name, value in _REQUIRED_SCALARS.items():
        if name in variables and _scalar(variables, name) != value:
            raise ValueError(f"{name} = {_scalar(variables, name)} is not supported by the HF Whisper architecture "
                             f"(expected {value})")
    unknown = []
    for name, tensor in variables.items():
        if name in _REQUIRED_SCALARS or name in _IGNORED or name in ("decoder/activation", "encoder/num_heads",
                                                                     "decoder/num_heads", "encoder/activation"):
            continue
        side, _, rest = name.partition("/")
        if side not in ("encoder", "decoder"):
            unknown.append(name)
            continue
        prefix = f"model.{side}"
        match = _LAYER_RE.match(name)
        if match is None:
            if rest in ("conv1/weight", "conv1/bias", "conv2/weight", "conv2/bias") and side == "encoder":
                put(f"{prefix}.{rest.replace('/', '.')}", tensor)
            elif rest == "position_encodings/encodings":
                put(f"{prefix}.embed_positions.weight", tensor)
            elif rest == "embeddings/weight" and side == "decoder":
                put(f"{prefix}.embed_tokens.weight", tensor)
            elif rest == "projection/weight" and side == "decoder":
                put("proj_out.weight", tensor)
            elif rest in ("layer_norm/gamma", "layer_norm/beta"):
                put(f"{prefix}.layer_norm.{_NORM_PARAMS[rest.rpartition('/')[2]]}", tensor)
            else:
                unknown.append(name)
            continue
        layer = f"{prefix}.layers.{match.group(2)}"
        module, _, param = match.group(3).rpartition("/")
        if module in _NORM_MODULES and param in _NORM_PARAMS:
            put(f"{layer}.{_NORM_MODULES[module]}.{_NORM_PARAMS[param]}", tensor)
        elif module in _LINEAR_MODULES and param in ("weight", "bias"):
            put(f"{layer}.{_LINEAR_MODULES[module]}.{param}", tensor)
        elif module == "self_attention/linear_0" and param in ("weight", "bias"):
            q, k, v = tensor.chunk(3, dim=0)
            put(f"{layer}.self_attn.q_proj.{param}", q)
            put(f"{layer}.self_attn.v_proj.{param}", v)
            if param == "weight":
                put(f"{layer}.self_attn.k_proj.weight", k)
        elif module == "attention/linear_1" and side == "decoder" and param in ("weight", "bias"):
            k, v = tensor.chunk(2, dim=0)
            put(f"{layer}.encoder_attn.v_proj.{param}", v)
            if param == "weight":
                put(f"{layer}.encoder_attn.k_proj.weight", k)
        else:
            unknown.append(name)
    if unknown:
        raise ValueError(f"CTranslate2 Whisper variables with no HF counterpart: {unknown[:10]}"
                         + (f" and {len(unknown) - 10} more" if len(unknown) > 10 else ""))
    for alias, target in aliases.items():
        if alias != "decoder/projection/weight" or target != "decoder/embeddings/weight":
            raise ValueError(f"unexpected CTranslate2 alias {alias!r} -> {target!r}")
    return state
