"""A step's host tensors moved to the device together: packed into one (pinned) host buffer, one non-blocking copy,
and device views of that one buffer in their own dtypes and shapes."""
from __future__ import annotations

from typing import Dict, Mapping, Optional

import torch

_ALIGNMENT = 64   # bytes: every view starts aligned for vectorised kernels


def _num_bytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def pack_to_device(tensors: Mapping[str, Optional[torch.Tensor]], device: torch.device) -> Dict[str, torch.Tensor]:
    """{name: the tensor on `device`} for the tensors that are not None, moved by one copy. On CUDA the host
    buffer is pinned and the copy does not block the host; the caching host allocator keeps the buffer from
    being reused before the copy has read it."""
    device = torch.device(device)
    present = {name: tensor for name, tensor in tensors.items() if tensor is not None}
    # already there (Whisper features computed on the GPU): passed through as they are
    resident = {name: tensor for name, tensor in present.items() if tensor.device.type != "cpu"
                and _same_device(tensor.device, device)}
    present = {name: tensor for name, tensor in present.items() if name not in resident}
    offsets, total = {}, 0
    for name, tensor in present.items():
        if tensor.device.type != "cpu":
            raise ValueError(f"{name} is on {tensor.device}: only host tensors and tensors on {device} are taken")
        offsets[name] = total
        total += -(-_num_bytes(tensor) // _ALIGNMENT) * _ALIGNMENT
    if not present:
        return dict(resident)
    host = torch.empty(total, dtype=torch.uint8, pin_memory=device.type == "cuda")
    for name, tensor in present.items():
        _view(host, offsets[name], tensor).copy_(tensor)
    buffer = host.to(device, non_blocking=True)
    return {**{name: _view(buffer, offsets[name], tensor) for name, tensor in present.items()}, **resident}


def _same_device(tensor_device: torch.device, device: torch.device) -> bool:
    """Whether a tensor on `tensor_device` is on `device` (a bare `cuda` names the current CUDA device)."""
    if tensor_device.type != device.type:
        return False
    if device.type != "cuda":
        return True
    current = torch.cuda.current_device()
    return (tensor_device.index if tensor_device.index is not None else current) == \
        (device.index if device.index is not None else current)


def _view(buffer: torch.Tensor, offset: int, like: torch.Tensor) -> torch.Tensor:
    """The bytes of `buffer` from `offset` as a contiguous tensor of like's dtype and shape."""
    return buffer[offset:offset + _num_bytes(like)].view(like.dtype).view(like.shape)
