"""The code path each build of the native linear and attention kernels must report, from the CPU's /proc/cpuinfo
flags (what -march=native targets) or from what a named -march enables, following the kernels' preprocessor
conditions."""
from typing import FrozenSet

import pytest

from seq2seq_engine.platforms import current_platform

# -march value -> the instruction-set flags (as /proc/cpuinfo spells them) it lets the compiler use, of those the
# kernels test, and the ones the CPU needs to run the build.
MARCH_FLAGS = {"x86-64": frozenset(), "x86-64-v2": frozenset(), "x86-64-v3": frozenset({"avx2", "fma"}),
               "alderlake": frozenset({"avx2", "fma", "avx_vnni"})}


def cpu_flags() -> FrozenSet[str]:
    """This CPU's flags (the platform's probe; empty where /proc/cpuinfo is missing)."""
    return current_platform().info.flags


def target_flags() -> FrozenSet[str]:
    """The flags this process's kernels were built for: the CPU's under -march=native, else what the platform's
    -march (SEQ2SEQ_ENGINE_NATIVE_MARCH or a SEQ2SEQ_ENGINE_CPU_ISA cap) enables; skips for an unknown -march."""
    march = current_platform().native_march()
    flags = cpu_flags() if march == "native" else MARCH_FLAGS.get(march)
    if flags is None:
        pytest.skip(f"no expected code path for -march={march}")
    return flags


def panel_isa(flags: FrozenSet[str]) -> str:
    """panel_linear_cpu.c: AVX-512F, else AVX2 + FMA."""
    return "avx512" if "avx512f" in flags else "avx2" if {"avx2", "fma"} <= flags else "none"


def attention_isa(flags: FrozenSet[str]) -> str:
    """paged_attention_cpu.c: AVX-512 F/BW/VL, else AVX2 + FMA, else the portable loops."""
    if {"avx512f", "avx512bw", "avx512vl"} <= flags:
        return "avx512"
    return "avx2" if {"avx2", "fma"} <= flags else "portable"


def int8_isa(flags: FrozenSet[str]) -> str:
    """int8_linear_cpu.c: AVX-512 F/BW/VNNI, else AVX-VNNI with AVX2, else AVX2."""
    if {"avx512f", "avx512bw", "avx512_vnni"} <= flags:
        return "avx512_vnni"
    if "avx2" in flags:
        return "avx_vnni" if "avx_vnni" in flags else "avx2"
    return "none"
