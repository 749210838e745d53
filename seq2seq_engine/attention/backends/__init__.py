"""Attention backends: `torch` (any device, the CPU default) and `cuda` (the kernels the CUDA platform chose), one
instance per device type, built on first use and shared by every layer."""
from __future__ import annotations

import functools

import torch

from seq2seq_engine.attention.backends.cuda_backend import CudaAttentionBackend
from seq2seq_engine.attention.backends.torch_backend import TorchAttentionBackend


@functools.lru_cache(maxsize=None)
def backend_for(device_type: str) -> TorchAttentionBackend:
    """The backend of a device type, built once per process: on CUDA from the platform's one decision (prefill by
    xformers or SDPA, paged kernels by Triton or torch), the torch backend elsewhere."""
    if device_type == "cuda":
        from seq2seq_engine.platforms import current_platform
        platform = current_platform("cuda")
        return CudaAttentionBackend(platform.prefill, platform.paged_kernels)
    return TorchAttentionBackend()


def select_backend(device: torch.device) -> TorchAttentionBackend:
    """The shared backend of `device`'s type (backend_for)."""
    return backend_for(device.type if isinstance(device, torch.device) else torch.device(device).type)
