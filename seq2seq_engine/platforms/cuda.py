"""The CUDA platform: which prefill attention (xformers or torch SDPA) and which paged decode and KV-cache kernels
(Triton or torch) run, each decided once per process by probing what imports and runs on this GPU."""
from __future__ import annotations

import dataclasses
import logging
from typing import Callable, Dict, List, Optional, Tuple

from seq2seq_engine.config import FP8_CACHE_CAPABILITY

logger = logging.getLogger(__name__)

PREFILL_XFORMERS = "xformers"
PREFILL_SDPA = "sdpa"
PAGED_TRITON = "triton"
PAGED_TORCH = "torch"
# The default token budget of a step on a GPU (encoder tokens included): about 21 Whisper windows or 64 documents of
# 512 tokens; the activations of such a step are a few hundred MB for Whisper large-v3 and BART-large.
CUDA_MAX_BATCHED_TOKENS = 32768

# (works, what was found or why not)
Probe = Tuple[bool, str]


def probe_xformers() -> Probe:
    """Whether xformers' memory-efficient attention imports and runs on this GPU: one tiny grouped-query call with a
    block-diagonal causal bias, the form the prefill uses."""
    quiet = logging.getLogger("xformers")
    previous = quiet.level
    quiet.setLevel(logging.ERROR)  # its import logs a long warning where its CUDA kernels are missing
    try:
        import xformers
        from xformers.ops import fmha
        from xformers.ops.fmha.attn_bias import BlockDiagonalCausalMask
    except Exception as error:  # ImportError, or whatever a broken install raises on import
        return False, f"xformers does not import ({type(error).__name__}: {error})"
    finally:
        quiet.setLevel(previous)
    try:
        import torch
        query = torch.randn(1, 5, 2, 2, 16, device="cuda", dtype=torch.float16)
        key = torch.randn(1, 5, 2, 1, 16, device="cuda", dtype=torch.float16).expand(1, 5, 2, 2, 16)
        bias = BlockDiagonalCausalMask.from_seqlens([2, 3], device=query.device)
        out = fmha.memory_efficient_attention_forward(query, key, key, attn_bias=bias, scale=0.25)
        if not bool(torch.isfinite(out).all()):
            return False, "xformers' memory-efficient attention gave non-finite values on this GPU"
    except Exception as error:  # no kernel for this GPU, a CUDA build mismatch, ...
        return False, f"xformers' CUDA ops do not run here ({type(error).__name__}: {error})"
    return True, f"xformers {getattr(xformers, '__version__', '?')}"


def probe_triton() -> Probe:
    """Whether triton imports and has an active GPU driver to compile for."""
    try:
        import triton
        from triton.runtime import driver
        target = driver.active.get_current_target()
    except Exception as error:  # ImportError, or no usable driver / backend
        return False, f"triton is not usable ({type(error).__name__}: {error})"
    return True, f"triton {getattr(triton, '__version__', '?')} ({getattr(target, 'backend', target)})"


def require_fp8_cache_support(device, capability: Optional[Tuple[int, int]] = None) -> None:
    """Raise a ValueError naming kv_cache_dtype unless ``device`` is a CUDA GPU whose kernels read an fp8 cache
    (``capability``: the device's, asked of torch when not given)."""
    import torch
    device = torch.device(device)
    if device.type != "cuda":
        raise ValueError(f"kv_cache_dtype fp8 needs a CUDA device, got {device.type!r}")
    if capability is None:
        capability = torch.cuda.get_device_capability(device)
    if tuple(capability) < FP8_CACHE_CAPABILITY:
        raise ValueError(f"kv_cache_dtype fp8 needs a GPU of compute capability {FP8_CACHE_CAPABILITY[0]}."
                         f"{FP8_CACHE_CAPABILITY[1]} or later; this one is {capability[0]}.{capability[1]}")


@dataclasses.dataclass(frozen=True)
class CudaPlatform:
    """A CUDA device and the kernels chosen for it: `prefill` is "xformers" (memory-efficient attention, where its
    CUDA ops run) or "sdpa" (torch's scaled_dot_product_attention); `paged_kernels` is "triton" (paged decode
    attention, KV-cache writes and block copies) or "torch" (the device-agnostic torch code of kernels/). The
    notes say what the probes found."""
    device_name: str
    prefill: str = PREFILL_SDPA
    paged_kernels: str = PAGED_TORCH
    prefill_note: str = ""
    paged_note: str = ""
    name: str = "cuda"

    def __post_init__(self) -> None:
        if self.prefill not in (PREFILL_XFORMERS, PREFILL_SDPA):
            raise ValueError(f"prefill must be {PREFILL_XFORMERS!r} or {PREFILL_SDPA!r}, got {self.prefill!r}")
        if self.paged_kernels not in (PAGED_TRITON, PAGED_TORCH):
            raise ValueError(f"paged_kernels must be {PAGED_TRITON!r} or {PAGED_TORCH!r}, got {self.paged_kernels!r}")

    @classmethod
    def probe(cls, device_name: Optional[str] = None, xformers: Callable[[], Probe] = probe_xformers,
              triton: Callable[[], Probe] = probe_triton) -> "CudaPlatform":
        """The platform of this process's CUDA device, its kernels chosen by the probes (logged once)."""
        if device_name is None:
            import torch
            device_name = torch.cuda.get_device_name()
        xformers_ok, prefill_note = xformers()
        triton_ok, paged_note = triton()
        platform = cls(device_name, PREFILL_XFORMERS if xformers_ok else PREFILL_SDPA,
                       PAGED_TRITON if triton_ok else PAGED_TORCH, prefill_note, paged_note)
        logger.info("CUDA platform %s: prefill attention by %s (%s); paged decode and KV-cache writes by %s (%s)",
                    device_name, platform.prefill, prefill_note, platform.paged_kernels, paged_note)
        return platform

    def kernel_rows(self) -> List[Tuple[str, str]]:
        """(what, kernel) rows for the start-up line and `seq2seq-engine env`."""
        if self.prefill == PREFILL_XFORMERS:
            prefill = "xformers memory-efficient attention (block-diagonal biases, grouped heads as views)"
        else:
            prefill = "torch SDPA per run of equal-shape blocks (enable_gqa)"
        triton = self.paged_kernels == PAGED_TRITON
        return [("prefill attention", prefill),
                ("paged decode attention", "triton paged kernel" if triton else "torch gather"),
                ("KV cache writes and block copies", "triton" if triton else "torch index_copy_")]

    def describe(self) -> Dict[str, str]:
        return {"gpu": self.device_name, "prefill": f"{self.prefill} ({self.prefill_note})" if self.prefill_note
                else self.prefill, "paged kernels": f"{self.paged_kernels} ({self.paged_note})" if self.paged_note
                else self.paged_kernels}
