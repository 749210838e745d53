"""float32 linear layers on oneDNN's prepacked weights, faster than F.linear on every shape measured (decisions §63).

``torch.ops.mkldnn._linear_pointwise`` with a weight reordered once by ``torch.ops.mkldnn._reorder_linear_weight``
computes x W^T in float32 (results within float rounding of F.linear's). ``pack_float32_model`` gives a float32 CPU
model such layers after loading: every nn.Linear (oneDNN's copy replaces the weight) and the logits projection of
models with ``set_lm_head`` (BART family, T5, Whisper; a tied head keeps the shared embedding matrix beside it).
"""
from __future__ import annotations

from types import MappingProxyType
from typing import Callable, Optional

import torch
from torch import nn

from seq2seq_engine.config import env_switch
from seq2seq_engine.models.utils import replace_linears

ONEDNN_LINEAR_ENV = "SEQ2SEQ_ENGINE_ONEDNN_LINEAR"
# HF activation name -> oneDNN post-op (attr, algorithm) applied to the matmul's output in the same pass: the same
# function (gelu: erf form, as F.gelu; within float32 rounding of torch's, decisions §63).
ONEDNN_ACTIVATIONS = MappingProxyType({"relu": ("relu", ""), "gelu": ("gelu", "none"), "silu": ("swish", ""),
                                       "swish": ("swish", "")})


def onednn_linear_available() -> bool:
    """Whether this torch build has oneDNN's prepacked float32 linear and SEQ2SEQ_ENGINE_ONEDNN_LINEAR is not 0."""
    return (env_switch(ONEDNN_LINEAR_ENV) and torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_linear_pointwise") and hasattr(torch.ops.mkldnn, "_reorder_linear_weight"))


class PackedLinear(nn.Module):
    """y = x W^T (+ b) from a float32 weight [out_features, in_features] through oneDNN's reordered copy (a buffer,
    so it counts in the model's bytes), for float32 CPU inputs only (F.linear would refuse others against a float32
    weight too). With `keep_weight`, `.weight` still names the weight (a tied head's embedding matrix, shared)."""

    def __init__(self, weight: torch.Tensor, bias: Optional[torch.Tensor] = None, keep_weight: bool = True) -> None:
        super().__init__()
        if weight.dtype != torch.float32 or weight.device.type != "cpu" or weight.dim() != 2:
            raise ValueError(f"PackedLinear takes a 2-d float32 CPU weight, got {weight.dtype} {tuple(weight.shape)} "
                             f"on {weight.device}")
        self.out_features, self.in_features = weight.shape
        self.weight = weight if keep_weight else None
        self.bias = bias
        self.register_buffer("packed_weight", torch.ops.mkldnn._reorder_linear_weight(weight.detach()),
                             persistent=False)

    def forward(self, x: torch.Tensor, addend: Optional[torch.Tensor] = None,
                activation: Optional[str] = None) -> torch.Tensor:
        """x W^T + b, plus `addend` (a [out_features] or [1, out_features] tensor) and then `activation` (a name of
        ONEDNN_ACTIVATIONS), both inside oneDNN's pass."""
        if x.dtype != torch.float32 or x.device.type != "cpu" or x.shape[-1] != self.in_features:
            raise TypeError(f"this float32 layer takes float32 CPU input [..., {self.in_features}], got "
                            f"{x.dtype} {tuple(x.shape)} on {x.device}")
        bias = self.bias
        if addend is not None:
            bias = addend.reshape(-1) if bias is None else addend.reshape(-1) + bias
        attr, algorithm = ("none", "") if activation is None else ONEDNN_ACTIVATIONS[activation]
        rows = x.reshape(-1, self.in_features)
        if rows.shape[0] == 0:
            return x.new_empty(*x.shape[:-1], self.out_features)
        out = torch.ops.mkldnn._linear_pointwise(rows.contiguous(), self.packed_weight, bias, attr, [], algorithm)
        return out.view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                "oneDNN prepacked")


def linear_then_activation(layer: nn.Module, activation: str, activation_fn: Callable, x: torch.Tensor):
    """activation_fn(layer(x)), the activation (HF name `activation`) inside the matmul's pass where the layer is
    packed and oneDNN has that function."""
    if isinstance(layer, PackedLinear) and activation in ONEDNN_ACTIVATIONS:
        return layer(x, activation=activation)
    return activation_fn(layer(x))


def pack_logits_head(model: nn.Module) -> bool:
    """Give a float32 CPU model's logits projection a PackedLinear (its own nn.Linear, or the tied embedding
    matrix through ``set_lm_head``); False where the model has no such head or oneDNN is missing."""
    if not onednn_linear_available() or not hasattr(model, "set_lm_head"):
        return False
    head = getattr(model, "lm_head", None)
    tied = model.tied_lm_head_weight() if hasattr(model, "tied_lm_head_weight") else None
    if isinstance(head, nn.Linear):
        weight, bias = head.weight, head.bias
    elif head is None and tied is not None:
        weight, bias = tied, None
    else:
        return False
    if weight.dtype != torch.float32 or weight.device.type != "cpu":
        return False
    bias = None if bias is None else bias.detach()
    model.set_lm_head(PackedLinear(weight.detach(), bias, keep_weight=tied is not None))
    return True


def pack_linears(module: nn.Module) -> int:
    """Replace every float32 CPU nn.Linear inside `module` by a PackedLinear without the plain weight (oneDNN's copy
    takes its place, so memory stays the same), in place; returns how many were replaced."""
    def packed(linear: nn.Linear) -> Optional[PackedLinear]:
        if linear.weight.dtype != torch.float32 or linear.weight.device.type != "cpu":
            return None
        bias = None if linear.bias is None else linear.bias.detach()
        return PackedLinear(linear.weight.detach(), bias, keep_weight=False)
    return replace_linears(module, packed)


def pack_float32_model(model: nn.Module) -> int:
    """Run a float32 CPU model's linear layers and logits head on oneDNN's prepacked weights, in place; returns how
    many layers were packed (0 where oneDNN is missing)."""
    if not onednn_linear_available():
        return 0
    return int(pack_logits_head(model)) + pack_linears(model)
