"""The code path each build of the native linear kernels must report, from the CPU's /proc/cpuinfo flags (what
-march=native targets) or from what a named -march enables, following the kernels' preprocessor conditions."""
from typing import FrozenSet

# -march value -> the instruction-set flags (as /proc/cpuinfo spells them) it lets the compiler use, of those the
# kernels test, and the ones the CPU needs to run the build.
MARCH_FLAGS = {"x86-64": frozenset(), "x86-64-v3": frozenset({"avx2", "fma"}),
               "alderlake": frozenset({"avx2", "fma", "avx_vnni"})}


def cpu_flags() -> FrozenSet[str]:
    """This CPU's flags ({} where /proc/cpuinfo is missing)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def panel_isa(flags: FrozenSet[str]) -> str:
    """panel_linear_cpu.c: AVX-512F, else AVX2 + FMA."""
    return "avx512" if "avx512f" in flags else "avx2" if {"avx2", "fma"} <= flags else "none"


def int8_isa(flags: FrozenSet[str]) -> str:
    """int8_linear_cpu.c: AVX-512 F/BW/VNNI, else AVX-VNNI with AVX2, else AVX2."""
    if {"avx512f", "avx512bw", "avx512_vnni"} <= flags:
        return "avx512_vnni"
    if "avx2" in flags:
        return "avx_vnni" if "avx_vnni" in flags else "avx2"
    return "none"
