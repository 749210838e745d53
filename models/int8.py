"""int8 Linear layers: per-channel int8 weights, dynamic per-row int8 activations, on the native VNNI kernel or
torch's fbgemm (decisions §36)."""
from __future__ import annotations

import warnings
from typing import Any, Dict, Optional, Tuple

import torch
from torch import nn

from seq2seq_engine.kernels.native_int8 import (Int8Panels, int8_linear_available, int8_panel_linear, to_int8_panels,
                                                unpack_int8_panels)
from seq2seq_engine.kernels.native_linear import check_epilogue
from seq2seq_engine.models.utils import get_activation, replace_linears
from seq2seq_engine.platforms import current_platform

QUANTIZATION_METHODS = ("int8",)


def int8_unsupported_reason(device: str) -> Optional[str]:
    """Why quantization="int8" cannot run here (None when it can): it needs torch's fbgemm kernels on a CPU."""
    if device != "cpu":
        return f"quantization='int8' runs on the CPU only (fbgemm kernels), not on {device!r}"
    if "fbgemm" not in torch.backends.quantized.supported_engines:
        return ("quantization='int8' needs torch's fbgemm quantized engine (x86-64 CPUs with AVX2), which this "
                f"torch build lacks (engines: {torch.backends.quantized.supported_engines})")
    return None


def activations_need_reduced_range() -> bool:
    """True where fbgemm multiplies without VNNI (the platform decides: seq2seq_engine/platforms/cpu_policy.py): its
    AVX2/AVX-512 int8 kernels add pairs of u8 x s8 products in int16 with saturation, so activations must be
    quantized to 7 bits (0..127) to keep every pair in range. With AVX-512 VNNI the products accumulate straight into
    int32 and all 8 bits are used."""
    return current_platform().fbgemm_needs_reduced_range


def quantize_weight(weight: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """(int8 [N, K], float32 scale [N]): symmetric per-output-channel quantization, q = round(w / scale) with
    scale = max |w_row| / 127 (1 for an all-zero row), so q is in [-127, 127] and |w - q * scale| <= scale / 2."""
    weight = weight.detach().float()
    amax = weight.abs().amax(dim=1)
    scale = torch.where(amax > 0, amax / 127.0, torch.ones_like(amax))
    qweight = torch.round(weight / scale[:, None]).clamp_(-127, 127).to(torch.int8)
    return qweight, scale


def _prepack(qweight: torch.Tensor, scale: torch.Tensor, bias: Optional[torch.Tensor]):
    """fbgemm's packed form of the weight (and float32 bias). fbgemm's prepack takes a per-channel qint8 tensor,
    a dtype torch 2.13 deprecates (warning at creation, pytorch#184982) but still runs; the deprecated tensor
    lives only inside this function."""
    engine = torch.backends.quantized.engine
    if engine not in ("x86", "fbgemm"):
        torch.backends.quantized.engine = "x86"      # x86 and fbgemm both pack linear weights with fbgemm
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r".*quantized tensor creation functions.*deprecated")
            qtensor = torch._make_per_channel_quantized_tensor(
                qweight, scale.double(), torch.zeros_like(scale, dtype=torch.int64), 0)
        return torch.ops.quantized.linear_prepack(qtensor, None if bias is None else bias.detach().float())
    finally:
        torch.backends.quantized.engine = engine


class Int8Linear(nn.Module):
    """y = x W^T + b from an int8 W with per-output-channel scales, each row of x quantized to int8 with its own
    scale (max |x_row| / 127), so a row ~100x larger than the rest (Whisper's decoder has them) does not leave the
    other rows a handful of levels. Two kernels, picked by `native` (None: the first available):

    * the native AVX-512 VNNI panel kernel (kernels/native_int8.py; decisions §36), which quantizes the rows and
      applies the scales, bias and an activation inside its own pass;
    * fbgemm's `torch.ops.quantized.linear_dynamic`, which quantizes its input per call to uint8 with one scale and
      zero point for the whole tensor: with `per_row` (the default) each row of x is first divided by its max |x|
      and the output row multiplied back (then the bias added).

    Only the kernel's packed copy of the int8 weight is kept; `weight` unpacks it, for inspection and
    `dequantized_weight()`. Inputs must be float32 CPU tensors of any leading shape."""

    def __init__(self, weight: torch.Tensor, bias: Optional[torch.Tensor] = None,
                 reduce_range: Optional[bool] = None, per_row: bool = True, native: Optional[bool] = None) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        qweight, scale = quantize_weight(weight)
        self.register_buffer("weight_scale", scale)
        self.register_buffer("bias", None if bias is None else bias.detach().float().clone())
        self.reduce_range = activations_need_reduced_range() if reduce_range is None else reduce_range
        self.per_row = per_row
        kernel_available = per_row and int8_linear_available()
        self.native = kernel_available if native is None else native
        if self.native and not kernel_available:
            raise ValueError("the native int8 kernel quantizes per row and needs AVX-512 VNNI and a C compiler; "
                             "use native=False here")
        self._packed = to_int8_panels(qweight, scale) if self.native else _prepack(
            qweight, scale, None if per_row else self.bias)

    @classmethod
    def from_linear(cls, linear: nn.Linear, reduce_range: Optional[bool] = None, per_row: bool = True) -> "Int8Linear":
        return cls(linear.weight, linear.bias, reduce_range, per_row)

    def prepared_state(self) -> Tuple[Dict[str, Any], Dict[str, torch.Tensor]]:
        """(facts, tensors) from which `from_prepared` rebuilds this layer without quantizing again: the native
        kernel's panels as they are, fbgemm's weight unpacked (its packed form is not a tensor)."""
        facts = dict(out_features=self.out_features, in_features=self.in_features, reduce_range=self.reduce_range,
                     per_row=self.per_row, native=self.native)
        tensors = {"weight_scale": self.weight_scale}
        if self.bias is not None:
            tensors["bias"] = self.bias
        if self.native:
            tensors.update(panels=self._packed.panels, offsets=self._packed.offsets, scales=self._packed.scales)
        else:
            tensors["qweight"] = self.weight
        return facts, tensors

    @classmethod
    def from_prepared(cls, facts: Dict[str, Any], tensors: Dict[str, torch.Tensor]) -> "Int8Linear":
        """The layer `prepared_state` describes, on its tensors as given (fbgemm's weight packed again)."""
        layer = cls.__new__(cls)
        nn.Module.__init__(layer)
        layer.out_features, layer.in_features = facts["out_features"], facts["in_features"]
        layer.register_buffer("weight_scale", tensors["weight_scale"])
        layer.register_buffer("bias", tensors.get("bias"))
        layer.reduce_range, layer.per_row, layer.native = facts["reduce_range"], facts["per_row"], facts["native"]
        if layer.native:
            layer._packed = Int8Panels(tensors["panels"], tensors["offsets"], tensors["scales"], layer.out_features,
                                       layer.in_features)
        else:
            layer._packed = _prepack(tensors["qweight"], layer.weight_scale, None if layer.per_row else layer.bias)
        return layer

    @property
    def fuses_activations(self) -> bool:
        """Whether forward applies an `activation` inside the kernel's pass (the native kernel does)."""
        return self.native

    @property
    def weight(self) -> torch.Tensor:
        """The int8 weight [out_features, in_features], unpacked from the kernel's copy."""
        if self.native:
            return unpack_int8_panels(self._packed)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r".*quantized tensor.*deprecated")
            qtensor, _ = torch.ops.quantized.linear_unpack(self._packed)
            return qtensor.int_repr()

    def dequantized_weight(self) -> torch.Tensor:
        """The float32 weight the int8 one stands for: q * scale."""
        return self.weight.float() * self.weight_scale[:, None]

    def forward(self, x: torch.Tensor, addend: Optional[torch.Tensor] = None,
                activation: Optional[str] = None) -> torch.Tensor:
        """x W^T + b (+ addend, a float32 tensor broadcast to [rows, out_features], added in the pass that
        rescales the rows: a logits bias costs no extra pass over a wide output), then `activation` (a name of
        PANEL_ACTIVATIONS; inside the kernel's pass on the native kernel)."""
        if x.dtype != torch.float32:
            raise TypeError(f"Int8Linear takes float32 inputs, got {x.dtype}")
        rows = x.reshape(-1, self.in_features)
        if rows.shape[0] == 0:
            return x.new_empty(*x.shape[:-1], self.out_features)
        if self.native:
            out = self._native_forward(rows, addend, activation)
        else:
            check_epilogue("Int8Linear", self.out_features, None, activation)   # the native kernel's activations
            out = self._fbgemm_forward(rows, addend)
            if activation is not None:
                out = get_activation(activation)(out)
        return out.view(*x.shape[:-1], self.out_features)

    def _native_forward(self, rows: torch.Tensor, addend: Optional[torch.Tensor],
                        activation: Optional[str]) -> torch.Tensor:
        bias, late_addend = self.bias, addend
        if addend is not None and addend.numel() == self.out_features:
            bias, late_addend = (addend.reshape(-1) if bias is None else addend.reshape(-1) + bias), None
        if late_addend is not None and activation is not None:
            raise ValueError("Int8Linear: a per-row addend and an activation cannot be combined")
        out = int8_panel_linear(rows if rows.stride(1) == 1 else rows.contiguous(), self._packed, bias, activation)
        return out if late_addend is None else out.add_(late_addend)

    def _fbgemm_forward(self, rows: torch.Tensor, addend: Optional[torch.Tensor]) -> torch.Tensor:
        bias = self.bias if addend is None else (addend if self.bias is None else addend + self.bias)
        if self.per_row:
            amax = torch.linalg.vector_norm(rows, float("inf"), dim=1, keepdim=True).clamp_(min=1e-30)  # max |x|
            out = torch.ops.quantized.linear_dynamic(rows / amax, self._packed, self.reduce_range)
            return out.mul_(amax) if bias is None else torch.addcmul(bias, out, amax, out=out)
        out = torch.ops.quantized.linear_dynamic(rows, self._packed, self.reduce_range)
        return out if addend is None else out.add_(addend)

    def extra_repr(self) -> str:
        kernel = "native VNNI panels" if self.native else "fbgemm"
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"reduce_range={self.reduce_range}, {kernel}")


class Int8Embedding(nn.Module):
    """An embedding table stored as int8 rows with one float32 scale per row (quantize_weight); a lookup returns
    the rows dequantized to float32. A quarter of float32's memory; CTranslate2's int8 stores embeddings so too."""

    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.num_embeddings, self.embedding_dim = weight.shape
        qweight, scale = quantize_weight(weight)
        self.register_buffer("qweight", qweight)
        self.register_buffer("weight_scale", scale)

    def prepared_state(self) -> Tuple[Dict[str, Any], Dict[str, torch.Tensor]]:
        """(facts, tensors) from which `from_prepared` rebuilds this table without quantizing again."""
        return {}, {"qweight": self.qweight, "weight_scale": self.weight_scale}

    @classmethod
    def from_prepared(cls, facts: Dict[str, Any], tensors: Dict[str, torch.Tensor]) -> "Int8Embedding":
        """The table `prepared_state` describes, on its tensors as given."""
        table = cls.__new__(cls)
        nn.Module.__init__(table)
        table.num_embeddings, table.embedding_dim = tensors["qweight"].shape
        table.register_buffer("qweight", tensors["qweight"])
        table.register_buffer("weight_scale", tensors["weight_scale"])
        return table

    @property
    def weight(self) -> torch.Tensor:
        """The float32 table the int8 one stands for: q * scale (built on each access)."""
        return self.qweight.float() * self.weight_scale[:, None]

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.qweight[input_ids].float() * self.weight_scale[input_ids].unsqueeze(-1)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, int8"


def _quantize_embeddings(model: nn.Module, weight: torch.Tensor) -> None:
    """Replace every nn.Embedding that holds `weight` by one Int8Embedding of it."""
    table = Int8Embedding(weight)
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Embedding) and child.weight is weight:
                setattr(parent, name, table)


def quantize_linears(module: nn.Module, reduce_range: Optional[bool] = None, per_row: bool = True) -> int:
    """Replace every nn.Linear inside `module` (fused projections included: one int8 matmul for q/k/v) by an
    Int8Linear built from its weights, in place; returns how many were replaced."""
    return replace_linears(module, lambda linear: Int8Linear.from_linear(linear, reduce_range, per_row))


def quantize_model(model: nn.Module, method: str = "int8") -> nn.Module:
    """Run the model's Linear layers in int8, in place: every nn.Linear, and the logits projection of models whose
    head is tied to the embeddings (`model.tied_lm_head_weight()`, when the model defines it), which gets an
    int8 copy, its embedding lookup then reading int8 rows too (Int8Embedding). The model must already be float32
    on the CPU."""
    if method not in QUANTIZATION_METHODS:
        raise ValueError(f"quantization must be one of {QUANTIZATION_METHODS} or None, got {method!r}")
    reduce_range = activations_need_reduced_range()
    quantize_linears(model, reduce_range)
    tied = getattr(model, "tied_lm_head_weight", None)
    if tied is not None and tied() is not None:
        weight = tied()
        model.set_lm_head(Int8Linear(weight, None, reduce_range))
        _quantize_embeddings(model, weight)
    return model
