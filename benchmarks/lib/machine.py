"""The CPU a benchmark ran on, for its header: the ratios to the peers depend on it (docs/performance.md §1)."""
from __future__ import annotations

import glob
import os
import platform

from seq2seq_engine.platforms.cpu_probe import CPUINFO, read_cpuinfo

CACHE_DIR = "/sys/devices/system/cpu/cpu0/cache"
SIZE_UNITS = {"": 1, "K": 1024, "M": 1024 ** 2, "G": 1024 ** 3}
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


def last_level_cache_bytes(cache_dir: str = CACHE_DIR) -> int:
    """The size of cpu0's largest cache as sysfs reports it (its `size` files, such as "307200K"), or 0 where sysfs
    has none."""
    sizes = [0]
    for path in glob.glob(os.path.join(cache_dir, "index*", "size")):
        with open(path, encoding="utf-8") as handle:
            text = handle.read().strip().upper()
        unit = text[-1:] if text[-1:] in SIZE_UNITS else ""
        digits = text[:-1] if unit else text
        if digits.isdigit():
            sizes.append(int(digits) * SIZE_UNITS[unit])
    return max(sizes)
