"""CPU memory behaviour of an engine step: glibc malloc tuning and the default per-step token budget on the CPU.

Large prefills allocate activations of tens of MB per layer. glibc serves blocks above its mmap threshold (at most
32 MiB) with fresh mmap'ed pages and returns them on free, so every such tensor page-faults again on first touch:
measured here, a 64-prompt SmolLM2 prefill step took 6.2 s with the defaults and 3.1 s with the tuning below, and
profiles of BART encoder steps showed a quarter of the time in the first write into new outputs (docs/performance.md).
``tune_malloc`` raises the mmap threshold to its maximum and keeps freed heap memory for reuse; the CPU token budget
keeps one step's widest activation under that threshold, so it is served from (reused) heap memory too. Blocks
above 32 MiB remain: the logits of a decode step ([256 rows, 58k vocabulary] float32 is 59 MB) and their softmax;
fresh pages cost ~30 ms per such tensor (decisions §35), so ``tune_malloc`` also turns malloc's mmap off
(M_MMAP_MAX = 0): every block then comes from the heap and is reused after it is freed.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import logging
from typing import Any, Optional

from seq2seq_engine.platforms.overrides import env_switch

logger = logging.getLogger(__name__)

MALLOC_ENV = "SEQ2SEQ_ENGINE_MALLOC_TUNING"
# glibc's largest allowed M_MMAP_THRESHOLD on 64-bit (DEFAULT_MMAP_THRESHOLD_MAX = 4 MiB * sizeof(long)).
MMAP_THRESHOLD_MAX = 32 * 1024 * 1024
# Freed memory at the top of the heap beyond this is returned to the system.
TRIM_THRESHOLD = 1024 * 1024 * 1024
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_MMAP_MAX = -1, -3, -4  # mallopt parameters (glibc's malloc.h)
# The step budget on accelerators and the upper bound of the CPU budget.
DEFAULT_MAX_BATCHED_TOKENS = 8192


def tune_malloc() -> bool:
    """Apply the malloc settings above to this process (glibc only); False where they were not applied.

    Set SEQ2SEQ_ENGINE_MALLOC_TUNING=0 to leave malloc as it is. The settings are process-wide and stay after the
    engine is gone (they only change which memory malloc reuses, never what a program computes).
    """
    mallopt = _libc_function("mallopt") if env_switch(MALLOC_ENV) else None
    if mallopt is None:
        return False
    applied = (mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_MAX) == 1 and mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
               and mallopt(_M_MMAP_MAX, 0) == 1)
    if not applied:
        logger.debug("mallopt refused the malloc tuning")
    return applied


def release_free_memory() -> bool:
    """Return the heap memory malloc holds free to the system (glibc `malloc_trim(0)`); False where not applied.

    Called once the model is loaded: loading frees as much as it keeps (checkpoint tensors, the float32 weights
    that int8 or bfloat16 replace), and without this the freed heap pages stay resident for the process's life.
    """
    malloc_trim = _libc_function("malloc_trim")
    if malloc_trim is None:
        return False
    malloc_trim.argtypes = [ctypes.c_size_t]
    return malloc_trim(0) in (0, 1)


def _libc_function(name: str) -> Optional[Any]:
    """The C library's function `name`; None where there is no such library or function (not glibc)."""
    try:
        return getattr(ctypes.CDLL(ctypes.util.find_library("c")), name)
    except (OSError, AttributeError, TypeError):
        return None


def widest_activation(hf_config: Any) -> int:
    """Largest per-token activation width of the model's layers (FFN inner width, fused gate/up counted twice)."""
    hidden = int(getattr(hf_config, "d_model", None) or getattr(hf_config, "hidden_size", None)
                 or getattr(hf_config, "n_embd", 0) or 0)
    widths = [4 * hidden]
    for name in ("encoder_ffn_dim", "decoder_ffn_dim", "ffn_dim", "n_inner"):
        widths.append(int(getattr(hf_config, name, None) or 0))
    widths.append(2 * int(getattr(hf_config, "intermediate_size", None) or 0))  # fused gate_up projection
    return max(max(widths), 1)


def cpu_max_batched_tokens(hf_config: Any, longest_prefill: int) -> int:
    """Default tokens per step on the CPU: as many as keep the widest float32 activation within the mmap threshold
    (at most DEFAULT_MAX_BATCHED_TOKENS), and never fewer than the longest single prefill."""
    fitting = MMAP_THRESHOLD_MAX // (4 * widest_activation(hf_config))
    return max(min(fitting, DEFAULT_MAX_BATCHED_TOKENS), longest_prefill)
