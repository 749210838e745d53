"""Native CPU kernels: C sources in kernels/csrc/ compiled once per machine by the system C compiler, loaded by ctypes.

No torch headers and no build step at install time: the first call compiles the source (about a second) into
``<cache_root()>/kernels/<name>-<hash>.so``; the hash covers the source and the shared headers, the compiler command
and this CPU's instruction-set flags, so a changed source or another machine builds afresh. Where no compiler works, or
``SEQ2SEQ_ENGINE_NATIVE_KERNELS=0``, ``load_library`` returns None (with one warning) and callers use their torch path.
The ``-march`` comes from the platform (seq2seq_engine/platforms): this CPU's, or the target of a
``SEQ2SEQ_ENGINE_CPU_ISA`` cap or of ``SEQ2SEQ_ENGINE_NATIVE_MARCH`` (the tests build the AVX2 paths so).
"""
from __future__ import annotations

import ctypes
import functools
import glob
import hashlib
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
from typing import Optional

import torch

from seq2seq_engine.cache_dir import cache_root
from seq2seq_engine.platforms import current_platform
from seq2seq_engine.platforms.cpu_policy import MARCH_ENV
from seq2seq_engine.platforms.overrides import env_switch

logger = logging.getLogger(__name__)

NATIVE_ENV = "SEQ2SEQ_ENGINE_NATIVE_KERNELS"
SOURCE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "csrc")
COMPILE_FLAGS = ["-O3", "-ffast-math", "-fopenmp", "-fPIC", "-shared"]
LINK_FLAGS = ["-lm"]


# The dtype codes the C kernels take for their tensors (float32 0, bfloat16 1).
DTYPE_CODES = {torch.float32: 0, torch.bfloat16: 1}


def tensor_ptr(tensor: Optional[torch.Tensor]) -> ctypes.c_void_p:
    """A tensor's data pointer for a C kernel argument (NULL for None)."""
    return ctypes.c_void_p(tensor.data_ptr() if tensor is not None else None)


def native_kernels_enabled() -> bool:
    """False when the user set SEQ2SEQ_ENGINE_NATIVE_KERNELS=0 (then every kernel runs its torch path)."""
    return env_switch(NATIVE_ENV)


@functools.lru_cache(maxsize=None)
def load_library(name: str) -> Optional[ctypes.CDLL]:
    """The compiled ``csrc/<name>.c`` (built on first use), or None where native kernels are off or cannot build."""
    if not native_kernels_enabled():
        return None
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        logger.warning("no C compiler found: native CPU kernels are off (the torch kernels run instead)")
        return None
    try:
        flushing = flushes_denormals()
        library = ctypes.CDLL(_build(name, compiler))
        if not flushing:
            # -ffast-math linked crtfastmath.o, whose constructor just set FTZ/DAZ on this thread only: undone, so
            # loading a kernel changes no thread's float semantics (nor when torch's OpenMP threads were started)
            torch.set_flush_denormal(False)
        return library
    except (OSError, subprocess.CalledProcessError) as error:
        detail = getattr(error, "stderr", "") or error
        logger.warning("building native kernel %s failed, using the torch kernels: %s", name, detail)
        return None


def flushes_denormals() -> bool:
    """Whether this thread flushes subnormal floats to zero (FTZ set in its MXCSR)."""
    tiny = sys.float_info.min
    return tiny / 2 == 0.0


def _build(name: str, compiler: str) -> str:
    """Path of the shared library for ``name``, compiling it (atomically) unless a matching build exists."""
    source = os.path.join(SOURCE_DIR, f"{name}.c")
    text = b""
    for path in [source, *sorted(glob.glob(os.path.join(SOURCE_DIR, "*.h")))]:   # a changed header rebuilds too
        with open(path, "rb") as handle:
            text += handle.read()
    command = [compiler, *COMPILE_FLAGS, f"-march={_march()}"]
    fingerprint = hashlib.sha256(text + repr(command).encode() + _cpu_flags().encode()).hexdigest()[:16]
    out_dir = os.path.join(cache_root(), "kernels")
    target = os.path.join(out_dir, f"{name}-{fingerprint}.so")
    if os.path.isfile(target):
        return target
    os.makedirs(out_dir, exist_ok=True)
    handle, partial = tempfile.mkstemp(prefix=f".{name}-", suffix=".so", dir=out_dir)
    os.close(handle)
    try:
        subprocess.run([*command, "-o", partial, source, *LINK_FLAGS], check=True, capture_output=True, text=True)
        os.replace(partial, target)
    finally:
        if os.path.exists(partial):
            os.remove(partial)
    logger.info("built native kernel %s -> %s", name, target)
    return target


def _march() -> str:
    """The -march value the platform picks (SEQ2SEQ_ENGINE_NATIVE_MARCH, a SEQ2SEQ_ENGINE_CPU_ISA cap, or native)."""
    march = current_platform().native_march()
    if not re.fullmatch(r"[A-Za-z0-9_.+-]+", march):
        raise ValueError(f"{MARCH_ENV} must be a compiler -march value such as native or x86-64-v3, got {march!r}")
    return march


def _cpu_flags() -> str:
    """This CPU's instruction-set flags (``-march=native`` output depends on them)."""
    return " ".join(sorted(current_platform().info.flags))
