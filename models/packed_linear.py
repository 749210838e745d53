"""float32 logits projections on oneDNN's prepacked weights: ~2x F.linear's rate for a wide vocabulary (decisions §61).

``torch.ops.mkldnn._linear_pointwise`` with a weight reordered once by ``torch.ops.mkldnn._reorder_linear_weight``
computes x W^T in float32 (results within float rounding of F.linear's); measured here for [128 rows] x 512 x 58,101
it ran at ~190 GFLOP/s against F.linear's ~80. ``pack_logits_head`` gives every model with ``set_lm_head`` (BART
family, T5, Whisper) such a head after loading; inputs that are not float32 CPU tensors take F.linear.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn


def onednn_linear_available() -> bool:
    """Whether this torch build has oneDNN's prepacked float32 linear."""
    return (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")
            and hasattr(torch.ops.mkldnn, "_reorder_linear_weight"))


class PackedLinear(nn.Module):
    """y = x W^T (+ b) from a float32 weight [out_features, in_features]; keeps the weight (shared, not copied) for
    the F.linear path and oneDNN's reordered copy for the fast one."""

    def __init__(self, weight: torch.Tensor, bias: Optional[torch.Tensor] = None) -> None:
        super().__init__()
        if weight.dtype != torch.float32 or weight.device.type != "cpu" or weight.dim() != 2:
            raise ValueError(f"PackedLinear takes a 2-d float32 CPU weight, got {weight.dtype} {tuple(weight.shape)} "
                             f"on {weight.device}")
        self.out_features, self.in_features = weight.shape
        self.weight = weight
        self.bias = bias
        self._packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.float32 or x.device.type != "cpu" or x.shape[-1] != self.in_features:
            return F.linear(x, self.weight, self.bias)
        rows = x.reshape(-1, self.in_features)
        if rows.shape[0] == 0:
            return x.new_empty(*x.shape[:-1], self.out_features)
        out = torch.ops.mkldnn._linear_pointwise(rows.contiguous(), self._packed, self.bias, "none", [], "")
        return out.view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, oneDNN prepacked"


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
    model.set_lm_head(PackedLinear(weight.detach(), None if bias is None else bias.detach()))
    return True
