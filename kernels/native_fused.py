"""Fused elementwise ops of the decoder layers (csrc/fused_ops_cpu.c), each with the plain-torch path it replaces.

Every function takes the same arguments on both paths and computes what HF's modules compute (RMSNorm in float32
then cast, neox rotary, SiLU- and GELU-gated products), rounding where they round. The native path runs for CPU
tensors of float32 or bfloat16 with unit stride along the last dimension; anything else (CUDA, float16, odd
strides, no C compiler, ``SEQ2SEQ_ENGINE_NATIVE_KERNELS=0``) runs the torch path.
"""
from __future__ import annotations

import ctypes
import math
from typing import Optional, Tuple

import torch
import torch.nn.functional as F

from .native import DTYPE_CODES, load_library, tensor_ptr


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
             residual: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """(weight * RMSNorm(h), h) with h = x + residual, or (weight * RMSNorm(x), None) without a residual.

    x may be a row-strided view; residual must be shaped like x."""
    if residual is not None and residual.shape != x.shape:
        raise ValueError(f"rms_norm: residual shape {tuple(residual.shape)} differs from input {tuple(x.shape)}")
    if weight.shape != x.shape[-1:]:
        raise ValueError(f"rms_norm: weight shape {tuple(weight.shape)} does not match hidden size {x.shape[-1]}")
    library = _library_for(x, weight, *(() if residual is None else (residual,)))
    if library is None or (residual is not None and not residual.is_contiguous()):
        return _rms_norm_torch(x, weight, eps, residual)
    rows, width = x.shape
    out = torch.empty(rows, width, dtype=x.dtype)
    summed = torch.empty_like(out) if residual is not None else None
    library.rms_norm(tensor_ptr(x), ctypes.c_int64(x.stride(0)), tensor_ptr(residual), tensor_ptr(summed),
                     tensor_ptr(weight), tensor_ptr(out), ctypes.c_int64(rows), ctypes.c_int64(width),
                     ctypes.c_float(eps), ctypes.c_int(DTYPE_CODES[x.dtype]), ctypes.c_int(torch.get_num_threads()))
    return out, summed


def rotary_neox(x: torch.Tensor, column: int, num_heads: int, head_dim: int, cos: torch.Tensor,
                sin: torch.Tensor) -> torch.Tensor:
    """Neox-rotated heads ``x[:, column : column + num_heads * head_dim]`` as a contiguous [T, num_heads * head_dim]
    tensor; cos/sin are [T, head_dim] in x's dtype (halves repeated)."""
    width = num_heads * head_dim
    if x.shape[-1] < column + width or cos.shape != (x.shape[0], head_dim) or sin.shape != cos.shape:
        raise ValueError(f"rotary_neox: {num_heads} heads of {head_dim} from column {column} need input columns "
                         f">= {column + width} (got {x.shape[-1]}) and cos/sin [{x.shape[0]}, {head_dim}] "
                         f"(got {tuple(cos.shape)} / {tuple(sin.shape)})")
    library = _library_for(x, cos, sin)
    if library is None or not (cos.is_contiguous() and sin.is_contiguous()):
        return _rotary_torch(x[:, column:column + width], num_heads, head_dim, cos, sin)
    tokens = x.shape[0]
    out = torch.empty(tokens, width, dtype=x.dtype)
    library.rotary_neox(tensor_ptr(x), ctypes.c_int64(x.stride(0)), ctypes.c_int64(column), tensor_ptr(cos),
                        tensor_ptr(sin), tensor_ptr(out), ctypes.c_int64(tokens), ctypes.c_int64(num_heads),
                        ctypes.c_int64(head_dim), ctypes.c_int(DTYPE_CODES[x.dtype]),
                        ctypes.c_int(torch.get_num_threads()))
    return out


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up for gate_up = [gate | up] along the last dimension."""
    if gate_up.shape[-1] % 2:
        raise ValueError(f"silu_and_mul: the last dimension ({gate_up.shape[-1]}) must hold gate and up halves")
    library = _library_for(gate_up)
    if library is None or not gate_up.is_contiguous():
        gate, up = gate_up.chunk(2, dim=-1)
        return F.silu(gate) * up
    tokens, width = gate_up.shape[0], gate_up.shape[1] // 2
    out = torch.empty(tokens, width, dtype=gate_up.dtype)
    library.silu_and_mul(tensor_ptr(gate_up), tensor_ptr(out), ctypes.c_int64(tokens), ctypes.c_int64(width),
                         ctypes.c_int(DTYPE_CODES[gate_up.dtype]), ctypes.c_int(torch.get_num_threads()))
    return out


def gelu_tanh_and_mul(gate_linear: torch.Tensor) -> torch.Tensor:
    """gelu_tanh(gate) * linear for gate_linear = [gate | linear] along the last dimension (gated-GELU feed-forward:
    T5 v1.1, Flan-T5, mT5). The native kernel serves float32 and rounds once, within a few ulps of HF's
    ``gelu_new``; other dtypes keep the op-by-op torch formula (and its rounding after each op)."""
    if gate_linear.shape[-1] % 2:
        raise ValueError(f"gelu_tanh_and_mul: the last dimension ({gate_linear.shape[-1]}) must hold gate and "
                         f"linear halves")
    library = _library_for(gate_linear) if gate_linear.dtype == torch.float32 else None
    if library is None or not gate_linear.is_contiguous():
        gate, linear = gate_linear.chunk(2, dim=-1)
        return _gelu_tanh_torch(gate) * linear
    tokens, width = gate_linear.shape[0], gate_linear.shape[1] // 2
    out = torch.empty(tokens, width, dtype=gate_linear.dtype)
    library.gelu_tanh_and_mul_f32(tensor_ptr(gate_linear), tensor_ptr(out), ctypes.c_int64(tokens),
                                  ctypes.c_int64(width), ctypes.c_int(torch.get_num_threads()))
    return out


def _gelu_tanh_torch(x: torch.Tensor) -> torch.Tensor:
    # HF's NewGELUActivation, op by op
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


def _rms_norm_torch(x, weight, eps, residual):
    if residual is not None:
        x = residual + x
    dtype = x.dtype
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(dtype), (x if residual is not None else None)


def _rotary_torch(x, num_heads, head_dim, cos, sin):
    x = x.reshape(x.shape[0], num_heads, head_dim)
    half = head_dim // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return (x * cos[:, None, :] + rotated * sin[:, None, :]).reshape(x.shape[0], -1)


def _library_for(*tensors: torch.Tensor) -> Optional[ctypes.CDLL]:
    first = tensors[0]
    if not all(t.device.type == "cpu" and t.dtype == first.dtype and t.dim() in (1, 2) and t.stride(-1) == 1
               for t in tensors) or first.dtype not in DTYPE_CODES or first.dim() != 2 or first.shape[0] == 0:
        return None
    return load_library("fused_ops_cpu")
