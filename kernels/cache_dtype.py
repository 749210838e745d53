"""KV-cache storage dtypes: float8 e4m3 is written saturated (scale 1, vLLM's default) and moved as raw bytes."""
from __future__ import annotations

import torch

FP8 = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8).max


def to_cache_dtype(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``tensor`` in the cache's dtype; into float8, values beyond its range become its largest value (a plain cast
    may give NaN there) and every other value rounds to nearest."""
    if dtype == FP8 and tensor.dtype != FP8:
        return tensor.clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return tensor.to(dtype)


def storage_view(cache: torch.Tensor) -> torch.Tensor:
    """A float8 tensor as its bytes (uint8, same shape), for the index copies torch has no float8 kernel for; any
    other tensor as it is."""
    return cache.view(torch.uint8) if cache.dtype == FP8 else cache


def compute_dtype_of(cache_dtype: torch.dtype) -> torch.dtype:
    """The dtype a cache's values take part in arithmetic as: float8 widens to float32 (torch does not promote
    float8), any other dtype is itself."""
    return torch.float32 if cache_dtype == FP8 else cache_dtype
