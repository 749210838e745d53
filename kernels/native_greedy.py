"""The sampler's all-greedy step in one read of the logits (csrc/greedy_cpu.c), with the torch path it replaces.

``greedy_logsumexp(logits)`` gives each row's greedy token (the first index of its maximum, as ``torch.max``)
and its log-sum-exp (so a token's logprob is ``logits[token] - lse``). The torch path reads a [N, 58k] row block
twice and writes a softmax of it; the native one reads it once and writes nothing. It runs for float32 CPU
tensors with unit stride along the vocabulary; anything else (or no C compiler, ``SEQ2SEQ_ENGINE_NATIVE_KERNELS=0``)
takes the torch path.
"""
from __future__ import annotations

import ctypes
from typing import Tuple

import torch

from .native import load_library, tensor_ptr


def greedy_logsumexp(logits: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """(tokens [N] int64, lse [N] float32) of float32 logits [N, V]."""
    if logits.dim() != 2 or logits.shape[1] == 0:
        raise ValueError(f"greedy_logsumexp takes logits [rows, vocab] with vocab > 0, got {tuple(logits.shape)}")
    library = None
    if logits.device.type == "cpu" and logits.dtype == torch.float32 and logits.stride(1) == 1:
        library = load_library("greedy_cpu")
    if library is None or logits.shape[0] == 0:
        return greedy_logsumexp_torch(logits)
    rows, width = logits.shape
    tokens = torch.empty(rows, dtype=torch.long)
    lse = torch.empty(rows, dtype=torch.float32)
    library.greedy_logsumexp(tensor_ptr(logits), ctypes.c_int64(logits.stride(0)), ctypes.c_int64(rows),
                             ctypes.c_int64(width), tensor_ptr(tokens), tensor_ptr(lse),
                             ctypes.c_int(torch.get_num_threads()))
    return tokens, lse


def greedy_logsumexp_torch(logits: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """The same with torch ops."""
    tokens, lse, _ = greedy_lse_and_probs(logits)
    return tokens, lse


def greedy_lse_and_probs(logits: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(greedy tokens, lse, softmax probs) from one max and one softmax pass: lse = max - log(softmax(x)_argmax),
    exact to float rounding (the sampler's mixed steps use the probs for their random rows)."""
    row_max, tokens = logits.max(dim=-1)
    probs = torch.softmax(logits, dim=-1)
    return tokens, row_max - probs.gather(1, tokens.unsqueeze(1)).squeeze(1).log(), probs
