"""The platform the engine runs on (CPU or CUDA), chosen once: the machine probe, the overrides and the kernel policy.

Also process-wide settings applied before torch loads (OpenMP wait policy, library ISA caps) and glibc malloc tuning.
"""
from __future__ import annotations

import functools
from typing import Union

from .cpu_policy import CpuPlatform
from .cpu_probe import cpu_info
from .cuda import CudaPlatform

Platform = Union[CpuPlatform, CudaPlatform]


@functools.lru_cache(maxsize=None)
def current_platform(device_type: str = "cpu") -> Platform:
    """The platform of `device_type` ("cpu" or "cuda"), built once per process."""
    if device_type == "cuda":
        return CudaPlatform.probe()
    if device_type != "cpu":
        raise ValueError(f"device must be cpu or cuda, got {device_type!r}")
    return CpuPlatform.from_cpu(cpu_info())
