"""Launching the Triton kernels: compiled for CUDA tensors, through Triton's interpreter for CPU tensors."""
from __future__ import annotations

from typing import Callable, Dict, Optional, Union

import torch

try:
    import triton
    import triton.knobs
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    # tl.sum / tl.max are themselves jit functions, which only the interpreter or only the compiler can call (as
    # TRITON_INTERPRET was at import); tl.reduce with these combine functions runs in both (numpy in the interpreter)
    sum_combine, max_combine = tl.standard._sum_combine, tl.standard._elementwise_max
except ImportError:  # the kernels are optional: without triton, triton_available() says so
    triton = tl = InterpretedFunction = JITFunction = sum_combine = max_combine = None

_LAUNCHERS: Dict[tuple, object] = {}


def triton_available(device: Union[str, torch.device, None] = None) -> bool:
    """Whether the Triton kernels can run on ``device`` (default CUDA): triton imports, and for CUDA a GPU is
    visible; CPU tensors always run through the interpreter."""
    if triton is None:
        return False
    kind = torch.device(device).type if device is not None else "cuda"
    if kind == "cpu":
        return True
    return kind == "cuda" and torch.cuda.is_available()


def kernel_for(fn: Callable, device: torch.device):
    """The launchable kernel of the plain function ``fn`` for tensors on ``device``: compiled by Triton on CUDA,
    interpreted on the CPU. Chosen per call from the tensors' device rather than once from TRITON_INTERPRET at
    import, so one process runs both (the CPU tests beside the CUDA engine)."""
    if triton is None:
        raise RuntimeError("the Triton kernels need the `triton` package, which is not installed")
    kind = torch.device(device).type
    if kind not in ("cpu", "cuda"):
        raise ValueError(f"the Triton kernels run on cuda or cpu tensors, got {kind}")
    # with TRITON_INTERPRET set at import, triton's own jit functions are interpreted ones: interpret CUDA too
    interpret = kind == "cpu" or triton.knobs.runtime.interpret
    key = (fn, interpret)
    if key not in _LAUNCHERS:
        _LAUNCHERS[key] = InterpretedFunction(fn) if interpret else JITFunction(fn)
    return _LAUNCHERS[key]


def next_power_of_two(value: int) -> int:
    """The smallest power of two at or above ``value`` (at least 1)."""
    return 1 << max(0, int(value) - 1).bit_length()


def token_tile(budget: int, smallest: int = 16, largest: int = 64) -> int:
    """Tokens a program handles per step: the largest power of two within ``budget``, clamped to the range."""
    tile = 1 << max(0, int(budget).bit_length() - 1)
    return max(smallest, min(largest, tile))


def check_device(name: str, tensor: torch.Tensor, device: Optional[torch.device]) -> None:
    """ValueError naming ``name`` when ``tensor`` is not on ``device``."""
    if tensor.device != device:
        raise ValueError(f"{name} is on {tensor.device}, expected {device}")
