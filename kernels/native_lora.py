"""ctypes front end of the float32 grouped LoRA kernels in csrc/lora_cpu.c (shrink, expand, and both per row tile)."""
from __future__ import annotations

import ctypes
from typing import Any

import torch

from .native import load_library, tensor_ptr
from .native_linear import library_isa

# The kernels read and write a step's rows in place, by the rows of each slot (LoRARuns.host_groups: the rows
# grouped by slot, int64 on the CPU), with no gathered copy of x or y. They take float32 CPU tensors: x, t and y
# with unit stride along a row (any row stride, so y may be a column slice of a wider output), A [slots, rank, in]
# and B [slots, out, rank] (made contiguous). Without a C compiler or with SEQ2SEQ_ENGINE_NATIVE_KERNELS=0 the
# library does not load and kernels/lora_ops.py keeps its torch path.
_LIBRARY = "lora_cpu"
# Ranks above this take the torch path (a tile's t lives on the kernel's stack: TILE_ROWS x rank floats).
MAX_RANK = 1024


def lora_native_available() -> bool:
    """Whether the native LoRA kernels built here."""
    return load_library(_LIBRARY) is not None


def lora_native_isa() -> str:
    """The code path the native LoRA kernels were built with ("avx512", "avx2", "portable"), "none" without them."""
    return library_isa(_LIBRARY, "lora_isa")


def native_fits(*tensors: torch.Tensor) -> bool:
    """Whether the native kernels take these operands (x/t/y: unit stride along a row; A/B: contiguous) and built."""
    for tensor in tensors:
        if tensor.device.type != "cpu" or tensor.dtype != torch.float32 or tensor.stride(-1) != 1:
            return False
    return lora_native_available()


def _runs_args(runs: Any) -> tuple:
    rows, starts, ends, slots = runs.host_groups
    return tensor_ptr(rows), tensor_ptr(starts), tensor_ptr(ends), tensor_ptr(slots), ctypes.c_int64(len(slots))


def _checked(status: int, kernel: str) -> None:
    if status != 0:
        raise MemoryError(f"native LoRA {kernel}: out of memory for its scratch buffers")


def native_shrink(x: torch.Tensor, a: torch.Tensor, runs: Any, t: torch.Tensor) -> None:
    """t[i] = x[i] A[slot]^T for the rows of every run (t's other rows untouched)."""
    library, a = load_library(_LIBRARY), a.contiguous()    # kept referenced: the kernel reads its memory
    _checked(library.lora_shrink_f32(
        tensor_ptr(x), ctypes.c_int64(x.stride(0)), tensor_ptr(a), ctypes.c_int64(a.shape[2]),
        ctypes.c_int64(a.shape[1]), *_runs_args(runs), tensor_ptr(t), ctypes.c_int64(t.stride(0)),
        ctypes.c_int(torch.get_num_threads())), "shrink")


def native_expand(t: torch.Tensor, b: torch.Tensor, runs: Any, y: torch.Tensor) -> None:
    """y[i] += t[i] B[slot]^T for the rows of every run."""
    library, b = load_library(_LIBRARY), b.contiguous()
    _checked(library.lora_expand_f32(
        tensor_ptr(t), ctypes.c_int64(t.stride(0)), tensor_ptr(b), ctypes.c_int64(b.shape[1]),
        ctypes.c_int64(b.shape[2]), *_runs_args(runs), tensor_ptr(y), ctypes.c_int64(y.stride(0)),
        ctypes.c_int(torch.get_num_threads())), "expand")


def native_apply(x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, runs: Any, y: torch.Tensor) -> None:
    """y[i] += (x[i] A[slot]^T) B[slot]^T for the rows of every run, shrink then expand per tile of rows."""
    library, a, b = load_library(_LIBRARY), a.contiguous(), b.contiguous()
    _checked(library.lora_apply_f32(
        tensor_ptr(x), ctypes.c_int64(x.stride(0)), tensor_ptr(a), tensor_ptr(b),
        ctypes.c_int64(a.shape[2]), ctypes.c_int64(b.shape[1]), ctypes.c_int64(a.shape[1]), *_runs_args(runs),
        tensor_ptr(y), ctypes.c_int64(y.stride(0)), ctypes.c_int(torch.get_num_threads())), "apply")
