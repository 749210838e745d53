"""Beam search's top-k candidates of each row in one read of the logits (csrc/topk_cpu.c), torch.topk elsewhere.

``row_topk(logits, k)`` gives what ``logits.topk(k)`` gives (values largest first, their indices; among equal
values the native kernel puts the lower index first, torch promises no order). torch.topk pushes a row's whole
vocabulary through a heap of k; the native kernel skips each block of the row that cannot beat the k-th best so
far. It runs for float32 CPU tensors with unit stride along the vocabulary whose rows each have k entries above
-3e38 (banned tokens are -inf); anything else (or no C compiler, ``SEQ2SEQ_ENGINE_NATIVE_KERNELS=0``) takes
torch.topk.
"""
from __future__ import annotations

import ctypes
from typing import Tuple

import torch

from .native import load_library, tensor_ptr


def row_topk(logits: torch.Tensor, k: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """(values [N, k], indices [N, k] int64) of logits [N, V], 0 <= k <= V."""
    if logits.dim() != 2 or not 0 <= k <= logits.shape[1]:
        raise ValueError(f"row_topk takes logits [rows, vocab] and 0 <= k <= vocab, got {tuple(logits.shape)} "
                         f"and k={k}")
    library = None
    if logits.device.type == "cpu" and logits.dtype == torch.float32 and logits.stride(1) == 1 and k > 0:
        library = load_library("topk_cpu")
    if library is None or logits.shape[0] == 0:
        return logits.topk(k)
    rows, width = logits.shape
    values = torch.empty(rows, k, dtype=torch.float32)
    indices = torch.empty(rows, k, dtype=torch.long)
    found = torch.empty(rows, dtype=torch.long)
    library.topk_rows(tensor_ptr(logits), ctypes.c_int64(logits.stride(0)), ctypes.c_int64(rows),
                      ctypes.c_int64(width), ctypes.c_int64(k), tensor_ptr(values), tensor_ptr(indices),
                      tensor_ptr(found), ctypes.c_int(torch.get_num_threads()))
    if bool((found < k).any()):
        return logits.topk(k)       # a row with fewer than k allowed tokens: torch orders its -inf entries
    return values, indices
