"""ctypes front end of the float32 panel linear layer in csrc/panel_linear_cpu.c (x W^T + b for any row count).

``to_panels(weight)`` stores a weight [N, K] as [ceil(N / 32), K, 32] column panels (zero-padded past N) and
``panel_linear(x, panels, out_features, bias, activation)`` computes activation(x W^T + bias) from them (the
activation applied to each output tile while it is in cache). ``to_panels(weight, dtype=torch.bfloat16)`` keeps
the panels in bfloat16 (half the memory and the bytes read per call, for CPUs without bfloat16 matmul instructions):
the kernel widens each weight vector to float32 as it loads it and computes as on float32 panels, so the result is
the float32 kernel's on ``weight.to(torch.bfloat16).float()``, bit for bit; x, bias and output stay float32. The
kernel has an AVX-512F and an AVX2 + FMA code
path, picked at build time by the compiler's target; ``panel_linear_isa()`` names the one built ("avx512", "avx2",
or "none": no such instruction set, no C compiler or ``SEQ2SEQ_ENGINE_NATIVE_KERNELS=0``) and
``panel_linear_available()`` says whether there is one; callers keep their other path where there is not.
"""
from __future__ import annotations

import ctypes
from types import MappingProxyType
from typing import Optional

import torch

from .native import load_library, tensor_ptr

PANEL_WIDTH = 32
_LIBRARY = "panel_linear_cpu"
# HF activation name -> the kernel's code (csrc/panel_linear_cpu.c), the same function as F.relu, F.silu and F.gelu
PANEL_ACTIVATIONS = MappingProxyType({"relu": 1, "silu": 2, "swish": 2, "gelu": 3})
# panel dtype -> the kernel that reads it
PANEL_DTYPES = MappingProxyType({torch.float32: "panel_linear_f32", torch.bfloat16: "panel_linear_bf16w"})


def panel_linear_available() -> bool:
    """Whether the native panel kernel built here with a SIMD code path (AVX-512F or AVX2 + FMA)."""
    library = load_library(_LIBRARY)
    return library is not None and library.panel_linear_supported() == 1


def panel_linear_isa() -> str:
    """The code path the panel kernel was built with: "avx512", "avx2", or "none" (also where it did not build)."""
    return library_isa(_LIBRARY, "panel_linear_isa")


def library_isa(name: str, function: str) -> str:
    """The string the native library `name` returns from its `const char *function(void)`, "none" without one."""
    library = load_library(name)
    if library is None:
        return "none"
    isa = getattr(library, function)
    isa.restype, isa.argtypes = ctypes.c_char_p, []
    return isa().decode()


def to_panels(weight: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The [ceil(N / 32), K, 32] panels of a 2-d float32 or bfloat16 weight [N, K] (a copy; columns past N are 0),
    in `dtype`: float32, or bfloat16 (the weight rounded as ``weight.to(torch.bfloat16)`` rounds it)."""
    if weight.dim() != 2 or weight.dtype not in PANEL_DTYPES:
        raise ValueError(f"to_panels takes a 2-d float32 or bfloat16 weight, got {weight.dtype} {tuple(weight.shape)}")
    if dtype not in PANEL_DTYPES:
        raise ValueError(f"to_panels: panels are float32 or bfloat16, not {dtype}")
    out_features, in_features = weight.shape
    num_panels = -(-out_features // PANEL_WIDTH)
    padded = torch.zeros(num_panels * PANEL_WIDTH, in_features, dtype=dtype)
    padded[:out_features] = weight
    return padded.view(num_panels, PANEL_WIDTH, in_features).transpose(1, 2).contiguous()


def check_epilogue(kernel: str, out_features: int, bias: Optional[torch.Tensor], activation: Optional[str]) -> None:
    """Refuse a bias that is not float32 [out_features] and an activation the panel kernels do not have."""
    if bias is not None and (bias.shape != (out_features,) or bias.dtype != torch.float32):
        raise ValueError(f"{kernel}: bias must be float32 [{out_features}], got {bias.dtype} {tuple(bias.shape)}")
    if activation is not None and activation not in PANEL_ACTIVATIONS:
        raise ValueError(f"{kernel}: activation {activation!r} is not one of {', '.join(PANEL_ACTIVATIONS)}")


def panel_linear(x: torch.Tensor, panels: torch.Tensor, out_features: int, bias: Optional[torch.Tensor] = None,
                 activation: Optional[str] = None) -> torch.Tensor:
    """x [rows, K] (float32 CPU, unit stride along K) times the panels' weight (float32 or bfloat16 panels of
    `to_panels`, computed in float32 either way), plus bias [out_features], then `activation` (a name of
    PANEL_ACTIVATIONS): a new contiguous float32 [rows, out_features] tensor."""
    num_panels, in_features, width = panels.shape
    if (x.dim() != 2 or x.shape[1] != in_features or x.dtype != torch.float32 or x.stride(1) != 1
            or width != PANEL_WIDTH or not panels.is_contiguous() or num_panels != -(-out_features // PANEL_WIDTH)
            or panels.dtype not in PANEL_DTYPES):
        raise ValueError(f"panel_linear: input {x.dtype} {tuple(x.shape)} (strides {x.stride()}) does not fit "
                         f"{panels.dtype} panels {tuple(panels.shape)} of {out_features} outputs")
    check_epilogue("panel_linear", out_features, bias, activation)
    out = torch.empty(x.shape[0], out_features, dtype=torch.float32)
    if x.shape[0] == 0:
        return out
    library = load_library(_LIBRARY)
    bias = None if bias is None else bias.contiguous()
    kernel = getattr(library, PANEL_DTYPES[panels.dtype])
    kernel(tensor_ptr(x), ctypes.c_int64(x.stride(0)), ctypes.c_int64(x.shape[0]), ctypes.c_int64(in_features),
           tensor_ptr(panels), ctypes.c_int64(out_features), tensor_ptr(bias),
           ctypes.c_int(PANEL_ACTIVATIONS.get(activation, 0)), tensor_ptr(out), ctypes.c_int64(out_features),
           ctypes.c_int(torch.get_num_threads()))
    return out
