"""float32 linear layers on a prepacked copy of their weight, faster than F.linear on every shape measured.

Two packings: the native panel kernel (kernels/native_linear.py: weight columns in panels of 32 streamed once per
step; decisions §34) and oneDNN's ``torch.ops.mkldnn._linear_pointwise`` on a weight reordered once by
``_reorder_linear_weight`` (decisions §34). ``float32_packing`` takes the first available one of the platform's
order for the layer's role (seq2seq_engine/platforms/cpu_policy.py): decode-step linears of encoder/decoder models
(their decoder's linears but the cross-attention K/V projections, and the logits head) or the others.
Both compute x W^T in float32 (results within float rounding of F.linear's). ``pack_float32_model`` gives a float32
CPU model such layers after loading: every nn.Linear (the packed copy replaces the weight) and the logits projection
of models with ``set_lm_head`` (BART family, T5, Whisper; a tied head keeps the shared embedding matrix beside it).
"""
from __future__ import annotations

from types import MappingProxyType
from typing import Any, Callable, Dict, Optional, Set, Tuple

import torch
from torch import nn

from seq2seq_engine.kernels.native_linear import panel_linear, panel_linear_available, to_panels
from seq2seq_engine.models.utils import replace_linears
from seq2seq_engine.platforms import current_platform
from seq2seq_engine.platforms.cpu_policy import PACKED_LINEAR_ENV

PACKINGS = ("panels", "onednn")
PACKING_NEEDS = MappingProxyType({"panels": "it needs a C compiler and a CPU with AVX2 + FMA or AVX-512F",
                                  "onednn": "this torch build has no oneDNN prepacked linear"})
# HF activation name -> oneDNN post-op (attr, algorithm) applied to the matmul's output in the same pass: the same
# function (gelu: erf form, as F.gelu; within float32 rounding of torch's, decisions §34).
ONEDNN_ACTIVATIONS = MappingProxyType({"relu": ("relu", ""), "gelu": ("gelu", "none"), "silu": ("swish", ""),
                                       "swish": ("swish", "")})


def onednn_linear_available() -> bool:
    """Whether this torch build has oneDNN's prepacked float32 linear."""
    return (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")
            and hasattr(torch.ops.mkldnn, "_reorder_linear_weight"))


def float32_packing(decode_step: bool = False, bf16_weights: bool = False) -> Optional[str]:
    """The packing a float32 linear gets here, one of PACKINGS, or None (plain F.linear): the first kernel of the
    platform's order for the linear's role (seq2seq_engine/platforms/cpu_policy.py) that is available. A packing
    forced by SEQ2SEQ_ENGINE_PACKED_LINEAR is refused where it is missing. `bf16_weights` puts the panels first
    where the order has them: only they hold bfloat16 weights."""
    order = current_platform().float32_linear_order("decode_step" if decode_step else "other")
    if bf16_weights and "panels" in order:     # only the panels keep bfloat16 weights: their memory is the point
        order = ("panels", *(kernel for kernel in order if kernel != "panels"))
    available = {"panels": panel_linear_available, "onednn": onednn_linear_available}
    if len(order) == 1 and order[0] in PACKINGS and not available[order[0]]():
        raise ValueError(f"{PACKED_LINEAR_ENV}={order[0]}: that packing is not available here ("
                         f"{PACKING_NEEDS[order[0]]})")
    return next((kernel for kernel in order if kernel in PACKINGS and available[kernel]()), None)


def packed_linear_available() -> bool:
    """Whether float32 linears get a packed weight here (float32_packing is not None)."""
    return float32_packing() is not None


class PackedLinear(nn.Module):
    """y = x W^T (+ b) from a float32 weight [out_features, in_features] through its packed copy (a buffer, so it
    counts in the model's bytes): panels for the native kernel where it is available, else oneDNN's reordered
    weight. Float32 CPU inputs only (F.linear would refuse others against a float32 weight too). With
    `keep_weight`, `.weight` still names the weight (a tied head's embedding matrix, shared); `panels` picks the
    packing (None: panels where the kernel is available). `weight_dtype` bfloat16 rounds the weight to bfloat16:
    the panels then hold it in bfloat16 (half the bytes; the kernel widens each vector as it loads it), oneDNN's
    copy holds the rounded values in float32; inputs, bias and outputs stay float32."""

    def __init__(self, weight: torch.Tensor, bias: Optional[torch.Tensor] = None, keep_weight: bool = True,
                 panels: Optional[bool] = None, weight_dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        if weight.dtype != torch.float32 or weight.device.type != "cpu" or weight.dim() != 2:
            raise ValueError(f"PackedLinear takes a 2-d float32 CPU weight, got {weight.dtype} {tuple(weight.shape)} "
                             f"on {weight.device}")
        self.out_features, self.in_features = weight.shape
        self.weight = weight if keep_weight else None
        self.bias = bias
        self.panels = float32_packing() == "panels" if panels is None else panels
        if self.panels and not panel_linear_available():
            raise ValueError(f"the native panel linear kernel is not available here ({PACKING_NEEDS['panels']})")
        if weight_dtype not in (torch.float32, torch.bfloat16):
            raise ValueError(f"PackedLinear keeps float32 or bfloat16 weights, not {weight_dtype}")
        self.weight_dtype = weight_dtype
        if self.panels:
            packed = to_panels(weight.detach(), dtype=weight_dtype)
        else:
            packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach().to(weight_dtype).float())
        self.register_buffer("packed_weight", packed, persistent=False)

    def prepared_state(self) -> Tuple[Dict[str, Any], Dict[str, torch.Tensor]]:
        """(facts, tensors) from which `from_prepared` rebuilds this layer without packing again (oneDNN's copy is
        opaque: its values are kept, in their plain layout, and reordered again)."""
        facts = dict(out_features=self.out_features, in_features=self.in_features, panels=self.panels,
                     weight_dtype=str(self.weight_dtype).replace("torch.", ""))
        if self.panels:
            tensors = {"packed_weight": self.packed_weight}
        else:
            tensors = {"reorder_weight": self.packed_weight.to_dense()}
        tensors.update(weight=self.weight, bias=self.bias)
        return facts, {name: tensor for name, tensor in tensors.items() if tensor is not None}

    @classmethod
    def from_prepared(cls, facts: Dict[str, Any], tensors: Dict[str, torch.Tensor]) -> "PackedLinear":
        """The layer `prepared_state` describes, on its tensors as given (no copy, no packing)."""
        layer = cls.__new__(cls)
        nn.Module.__init__(layer)
        layer.out_features, layer.in_features = facts["out_features"], facts["in_features"]
        layer.weight, layer.bias = tensors.get("weight"), tensors.get("bias")
        layer.panels, layer.weight_dtype = facts["panels"], getattr(torch, facts["weight_dtype"])
        packed = (tensors["packed_weight"] if layer.panels
                  else torch.ops.mkldnn._reorder_linear_weight(tensors["reorder_weight"]))
        layer.register_buffer("packed_weight", packed, persistent=False)
        return layer

    def forward(self, x: torch.Tensor, addend: Optional[torch.Tensor] = None,
                activation: Optional[str] = None) -> torch.Tensor:
        """x W^T + b, plus `addend` (a [out_features] or [1, out_features] tensor, added as part of the bias) and
        then `activation` (a name of ONEDNN_ACTIVATIONS), both inside the matmul's pass on either path."""
        if x.dtype != torch.float32 or x.device.type != "cpu" or x.shape[-1] != self.in_features:
            raise TypeError(f"this float32 layer takes float32 CPU input [..., {self.in_features}], got "
                            f"{x.dtype} {tuple(x.shape)} on {x.device}")
        bias = self.bias
        if addend is not None:
            bias = addend.reshape(-1) if bias is None else addend.reshape(-1) + bias
        rows = x.reshape(-1, self.in_features)
        if rows.shape[0] == 0:
            return x.new_empty(*x.shape[:-1], self.out_features)
        if self.panels:
            out = panel_linear(rows if rows.stride(1) == 1 else rows.contiguous(), self.packed_weight,
                               self.out_features, bias, activation)
        else:
            attr, algorithm = ("none", "") if activation is None else ONEDNN_ACTIVATIONS[activation]
            out = torch.ops.mkldnn._linear_pointwise(rows.contiguous(), self.packed_weight, bias, attr, [],
                                                     algorithm)
        return out.view(*x.shape[:-1], self.out_features)

    @property
    def fuses_activations(self) -> bool:
        """Whether forward applies an `activation` inside the matmul's pass: on either packing."""
        return True

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"{'panels' if self.panels else 'oneDNN prepacked'}, "
                f"weights {str(self.weight_dtype).replace('torch.', '')}")


def linear_then_activation(layer: nn.Module, activation: str, activation_fn: Callable, x: torch.Tensor):
    """activation_fn(layer(x)), the activation (HF name `activation`) inside the matmul's pass where the layer
    fuses activations (a PackedLinear, or an Int8Linear on the native kernel) and the activation is one of
    ONEDNN_ACTIVATIONS (the panel kernels have the same ones)."""
    if getattr(layer, "fuses_activations", False) and activation in ONEDNN_ACTIVATIONS:
        return layer(x, activation=activation)
    return activation_fn(layer(x))


def decode_step_linears(model: nn.Module) -> Set[int]:
    """ids of the linears of an encoder/decoder model that run once per decode step, over one row per running
    sequence: every nn.Linear inside a module named ``decoder`` but the cross-attention K/V projections (a
    module names those children in ``encoder_row_linears``; they run over the encoder's rows at prefill). Empty
    for other models."""
    if not getattr(model, "is_encoder_decoder", False):
        return set()
    found: Set[int] = set()
    for name, module in model.named_modules():
        if "decoder" not in name.split("."):
            continue
        skipped = getattr(module, "encoder_row_linears", ())
        found.update(id(child) for child_name, child in module.named_children()
                     if isinstance(child, nn.Linear) and child_name not in skipped)
    return found


def pack_logits_head(model: nn.Module, weight_dtype: torch.dtype = torch.float32) -> bool:
    """Give a float32 CPU model's logits projection a PackedLinear (its own nn.Linear, or the tied embedding
    matrix through ``set_lm_head``); False where the model has no such head or no packing is available. The head
    runs once per decode step: it gets the decode-step packing."""
    if not packed_linear_available() or not hasattr(model, "set_lm_head"):
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
    model.set_lm_head(PackedLinear(weight.detach(), bias, keep_weight=tied is not None,
                                   panels=float32_packing(True, weight_dtype == torch.bfloat16) == "panels",
                                   weight_dtype=weight_dtype))
    return True


def float_weight_linears(model: nn.Module) -> Set[int]:
    """ids of the linears whose plain weight the model reads itself, so they stay nn.Linear: the children a module
    names in ``float_weight_linears`` (T5's K/V projections, which attend to the encoder states through their
    weights instead of running)."""
    return {id(child) for module in model.modules() for child_name, child in module.named_children()
            if child_name in getattr(module, "float_weight_linears", ())}


def pack_linears(module: nn.Module, decode_step: Optional[Set[int]] = None,
                 weight_dtype: torch.dtype = torch.float32) -> int:
    """Replace every float32 CPU nn.Linear inside `module` but the float_weight_linears by a PackedLinear without
    the plain weight (the packed copy takes its place, so memory stays the same), in place; returns how many were
    replaced. The linears whose
    ids are in `decode_step` get the decode-step packing."""
    decode_step = decode_step or set()
    kept = float_weight_linears(module)

    def packed(linear: nn.Linear) -> Optional[PackedLinear]:
        if linear.weight.dtype != torch.float32 or linear.weight.device.type != "cpu" or id(linear) in kept:
            return None
        bias = None if linear.bias is None else linear.bias.detach()
        panels = float32_packing(id(linear) in decode_step, weight_dtype == torch.bfloat16) == "panels"
        return PackedLinear(linear.weight.detach(), bias, keep_weight=False, panels=panels, weight_dtype=weight_dtype)
    return replace_linears(module, packed)


def pack_float32_model(model: nn.Module, weight_dtype: torch.dtype = torch.float32) -> int:
    """Run a float32 CPU model's linear layers and logits head on packed weights (kept in `weight_dtype`: float32,
    or bfloat16 computed in float32), in place; returns how many layers were packed (0 where no packing is
    available or SEQ2SEQ_ENGINE_PACKED_LINEAR=0)."""
    if not packed_linear_available():
        return 0
    decode_step = decode_step_linears(model)
    return int(pack_logits_head(model, weight_dtype)) + pack_linears(model, decode_step, weight_dtype)
