"""The candidates of linear_kernels.py --mode shapes: each computes y = x W^T + b with one kernel or library."""
from __future__ import annotations

from typing import Callable

CANDIDATES = ("float32", "float32-onednn", "float32-panels", "bfloat16", "int8-panels", "int8-fbgemm",
              "int8-fbgemm-pt", "int8-onednn", "int8-intmm", "w8-bf16", "torchao")


def _quantized(weight):
    from seq2seq_engine.models.int8 import quantize_weight
    return quantize_weight(weight)


def _onednn(x, weight, bias) -> Callable:
    import torch
    qweight, scale = _quantized(weight)
    packed = torch.ops.onednn.qlinear_prepack(qweight, list(x.shape))
    zeros = torch.zeros(weight.shape[0], dtype=torch.int64)

    def run():
        low, high = torch.aminmax(x)
        low, high = min(low.item(), 0.0), max(high.item(), 0.0)
        x_scale = max(high - low, 1e-8) / 255.0
        zero_point = int(round(-low / x_scale))
        qx = torch.clamp(torch.round(x / x_scale) + zero_point, 0, 255).to(torch.uint8)
        return torch.ops.onednn.qlinear_pointwise(qx, x_scale, zero_point, packed, scale, zeros, bias, 1.0, 0,
                                                  torch.float32, "none", [], "")
    return run


def _intmm(x, weight, bias) -> Callable:
    import torch
    qweight, scale = _quantized(weight)
    qweight_t = qweight.t()

    def run():
        x_scale = x.abs().amax(dim=1, keepdim=True).clamp(min=1e-8) / 127.0
        qx = torch.round(x / x_scale).to(torch.int8)
        return torch._int_mm(qx, qweight_t) * x_scale * scale + bias
    return run


def _torchao(x, weight, bias) -> Callable:
    import torch
    from torchao.quantization import Int8DynamicActivationInt8WeightConfig, quantize_
    linear = torch.nn.Linear(weight.shape[1], weight.shape[0])
    with torch.no_grad():
        linear.weight.copy_(weight)
        linear.bias.copy_(bias)
    quantize_(linear, Int8DynamicActivationInt8WeightConfig())
    return lambda: linear(x)


def build(name: str, x, weight, bias) -> Callable:
    """A no-argument callable computing x W^T + b with candidate `name` (weights prepared outside the timing)."""
    import torch
    import torch.nn.functional as F
    if name == "float32":
        return lambda: F.linear(x, weight, bias)
    if name in ("float32-onednn", "float32-panels"):
        from seq2seq_engine.models.packed_linear import PackedLinear
        layer = PackedLinear(weight, bias, keep_weight=False, panels=name == "float32-panels")
        return lambda: layer(x)
    if name == "bfloat16":
        xb, wb, bb = x.bfloat16(), weight.bfloat16(), bias.bfloat16()
        return lambda: F.linear(xb, wb, bb)
    if name in ("int8-panels", "int8-fbgemm", "int8-fbgemm-pt"):
        from seq2seq_engine.models.int8 import Int8Linear
        layer = Int8Linear(weight, bias, per_row=name != "int8-fbgemm-pt", native=name == "int8-panels")
        return lambda: layer(x)
    if name == "w8-bf16":
        qweight, scale = _quantized(weight)
        xb, sb, bb = x.bfloat16(), scale.bfloat16(), bias.bfloat16()
        return lambda: torch._weight_int8pack_mm(xb, qweight, sb) + bb
    return {"int8-onednn": _onednn, "int8-intmm": _intmm, "torchao": _torchao}[name](x, weight, bias)
