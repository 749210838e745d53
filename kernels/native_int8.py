"""ctypes front end of the int8 panel linear layer in csrc/int8_linear_cpu.c (AVX-512 VNNI, AVX-VNNI or AVX2).

``to_int8_panels(qweight, scale)`` stores a symmetric per-channel int8 weight [N, K] (values in [-127, 127]) as
``Int8Panels``: [ceil(N / 32), ceil(K / 4), 32, 4] panels with the column offsets and zero-padded scales the kernel
reads. ``int8_panel_linear(x, packed, bias, activation)`` quantizes each row of x to int8 with its own scale
(max |x_row| / 127) and computes activation((x_q W_q^T) * row_scale * column_scale + bias). The kernel has three
code paths, picked at build time by the compiler's target, that compute the same exact integer sums of 8-bit
products and the same floats: AVX-512 VNNI, AVX-VNNI (ymm vpdpbusd) and plain AVX2 (vpmaddubsw on |q| and signed
weights, which cannot saturate). ``int8_linear_isa()`` names the one built ("avx512_vnni", "avx_vnni", "avx2", or
"none": no AVX2, no C compiler or ``SEQ2SEQ_ENGINE_NATIVE_KERNELS=0``) and ``int8_linear_available()`` says whether
there is one; callers keep fbgemm's path where there is not.
"""
from __future__ import annotations

import ctypes
from typing import NamedTuple, Optional

import torch

from .native import load_library, tensor_ptr
from .native_linear import PANEL_ACTIVATIONS, PANEL_WIDTH, check_epilogue, library_isa

GROUP = 4    # input channels per int32 lane of the kernel's sums (vpdpbusd's operand layout)
_LIBRARY = "int8_linear_cpu"


class Int8Panels(NamedTuple):
    """A packed int8 weight: panels [ceil(N / 32), ceil(K / 4), 32, 4] int8, offsets [ceil(N / 32) * 32] int32
    (128 * the sum of each column's weights), scales [ceil(N / 32) * 32] float32 (0 past N), and N, K."""
    panels: torch.Tensor
    offsets: torch.Tensor
    scales: torch.Tensor
    out_features: int
    in_features: int


def int8_linear_available() -> bool:
    """Whether the native int8 kernel built here with a SIMD code path (AVX-512 VNNI, AVX-VNNI or AVX2)."""
    library = load_library(_LIBRARY)
    return library is not None and library.int8_linear_supported() == 1


def int8_linear_isa() -> str:
    """The code path the int8 kernel was built with: "avx512_vnni", "avx_vnni", "avx2", or "none" (also where it
    did not build)."""
    return library_isa(_LIBRARY, "int8_linear_isa")


def to_int8_panels(qweight: torch.Tensor, scale: torch.Tensor) -> Int8Panels:
    """The packed form of an int8 weight [N, K] in [-127, 127] with its float32 per-row scales [N] (copies)."""
    if qweight.dim() != 2 or qweight.dtype != torch.int8 or scale.shape != qweight.shape[:1]:
        raise ValueError(f"to_int8_panels takes a 2-d int8 weight and one scale per row, got {qweight.dtype} "
                         f"{tuple(qweight.shape)} and scales {tuple(scale.shape)}")
    if int(qweight.min()) < -127:
        raise ValueError("to_int8_panels: weights must be in [-127, 127] (-128 is not symmetric)")
    out_features, in_features = qweight.shape
    num_panels, groups = -(-out_features // PANEL_WIDTH), -(-in_features // GROUP)
    padded = torch.zeros(num_panels * PANEL_WIDTH, groups * GROUP, dtype=torch.int8)
    padded[:out_features, :in_features] = qweight
    panels = padded.view(num_panels, PANEL_WIDTH, groups, GROUP).permute(0, 2, 1, 3).contiguous()
    offsets = padded.sum(dim=1, dtype=torch.int32) * 128
    scales = torch.zeros(num_panels * PANEL_WIDTH, dtype=torch.float32)
    scales[:out_features] = scale.float()
    return Int8Panels(panels, offsets, scales, out_features, in_features)


def unpack_int8_panels(packed: Int8Panels) -> torch.Tensor:
    """The int8 weight [N, K] the panels hold."""
    num_panels, groups = packed.panels.shape[:2]
    weight = packed.panels.permute(0, 2, 1, 3).reshape(num_panels * PANEL_WIDTH, groups * GROUP)
    return weight[:packed.out_features, :packed.in_features].contiguous()


def int8_panel_linear(x: torch.Tensor, packed: Int8Panels, bias: Optional[torch.Tensor] = None,
                      activation: Optional[str] = None) -> torch.Tensor:
    """x [rows, K] (float32 CPU, unit stride along K), each row quantized to int8, times the packed weight, plus
    bias [N], then `activation` (a name of PANEL_ACTIVATIONS): a new contiguous [rows, N] float32 tensor."""
    out_features, in_features = packed.out_features, packed.in_features
    if x.dim() != 2 or x.shape[1] != in_features or x.dtype != torch.float32 or x.stride(1) != 1:
        raise ValueError(f"int8_panel_linear: input {x.dtype} {tuple(x.shape)} (strides {x.stride()}) does not "
                         f"fit a weight of {in_features} inputs")
    check_epilogue("int8_panel_linear", out_features, bias, activation)
    rows = x.shape[0]
    out = torch.empty(rows, out_features, dtype=torch.float32)
    if rows == 0:
        return out
    quantized_rows = torch.empty(rows, packed.panels.shape[1] * GROUP, dtype=torch.uint8)
    row_scales = torch.empty(rows, dtype=torch.float32)
    bias = None if bias is None else bias.contiguous()
    load_library(_LIBRARY).int8_linear(
        tensor_ptr(x), ctypes.c_int64(x.stride(0)), ctypes.c_int64(rows), ctypes.c_int64(in_features),
        tensor_ptr(packed.panels), tensor_ptr(packed.offsets), tensor_ptr(packed.scales),
        ctypes.c_int64(out_features), tensor_ptr(bias), ctypes.c_int(PANEL_ACTIVATIONS.get(activation, 0)),
        tensor_ptr(quantized_rows), tensor_ptr(row_scales), tensor_ptr(out), ctypes.c_int64(out_features),
        ctypes.c_int(torch.get_num_threads()))
    return out
