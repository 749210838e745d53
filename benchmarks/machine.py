"""The CPU a benchmark ran on, for its header: the ratios to the peers depend on it (docs/performance.md §10)."""
from __future__ import annotations

import platform

from seq2seq_engine.platforms.cpu_vendor import CPUINFO, read_cpuinfo

# the instruction-set extensions that change which kernels run (ours and the peers' MKL/oneDNN), in print order
MATMUL_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_int8")


def cpu_description(path: str = CPUINFO) -> str:
    """'cpu MODEL (VENDOR family F model M; FLAG FLAG ...)', or platform's processor name off Linux."""
    fields = read_cpuinfo(path)
    if not fields:
        return f"cpu {platform.processor() or platform.machine()}"
    flags = set(fields.get("flags", "").split())
    present = " ".join(flag for flag in MATMUL_FLAGS if flag in flags) or "no AVX2"
    vendor = f"{fields.get('vendor_id', '?')} family {fields.get('cpu family', '?')} model {fields.get('model', '?')}"
    return f"cpu {fields.get('model name', '?')} ({vendor}; {present})"
