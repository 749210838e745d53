"""The one probe of this machine's CPU: vendor, model, instruction-set flags, cache sizes and cores, read once."""
from __future__ import annotations

import dataclasses
import functools
import glob
import os
from typing import Dict, FrozenSet

CPUINFO = "/proc/cpuinfo"
CACHE_SYSFS = "/sys/devices/system/cpu/cpu0/cache"
INTEL = "GenuineIntel"
AMD = "AuthenticAMD"
# The instruction-set flags the kernel policy reads (names as /proc/cpuinfo spells them).
ISA_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_bf16", "avx512_vnni", "avx_vnni",
             "amx_tile", "amx_bf16", "amx_int8")


@dataclasses.dataclass(frozen=True)
class CpuInfo:
    """What the kernel policy needs to know of a CPU (empty strings and 0 where the system does not say)."""
    vendor: str
    model_name: str
    flags: FrozenSet[str]
    l2_bytes: int
    l3_bytes: int
    cores: int

    def has(self, *flags: str) -> bool:
        """Whether the CPU has every one of `flags`."""
        return all(flag in self.flags for flag in flags)

    @property
    def isa_flags(self) -> str:
        """The ISA_FLAGS this CPU has, space-separated (for reports)."""
        return " ".join(flag for flag in ISA_FLAGS if flag in self.flags) or "-"


def read_cpuinfo(path: str = CPUINFO) -> Dict[str, str]:
    """The first processor's fields of a /proc/cpuinfo-style file ({} where it cannot be read)."""
    fields: Dict[str, str] = {}
    try:
        with open(path, encoding="utf-8") as handle:
            for line in handle:
                if not line.strip():
                    break
                key, _, value = line.partition(":")
                fields[key.strip()] = value.strip()
    except OSError:
        return {}
    return fields


def parse_cache_size(text: str) -> int:
    """Bytes of a sysfs cache size such as "1024K" or "32M" (0 where it does not parse)."""
    text = text.strip().upper()
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    digits = text[:-1] if text[-1:] in "KMG" else text
    return int(digits) * scale if digits.isdigit() else 0


def read_cache_sizes(sysfs: str = CACHE_SYSFS) -> Dict[int, int]:
    """{level: bytes} of the unified or data caches of cpu0 (L1 data, L2, L3); {} where sysfs does not say."""
    sizes: Dict[int, int] = {}
    for index in sorted(glob.glob(os.path.join(sysfs, "index*"))):
        try:
            with open(os.path.join(index, "level"), encoding="utf-8") as handle:
                level = int(handle.read())
            with open(os.path.join(index, "type"), encoding="utf-8") as handle:
                kind = handle.read().strip()
            with open(os.path.join(index, "size"), encoding="utf-8") as handle:
                size = parse_cache_size(handle.read())
        except (OSError, ValueError):
            continue
        if kind in ("Data", "Unified"):
            sizes[level] = size
    return sizes


def probe_cpu(cpuinfo: str = CPUINFO, sysfs: str = CACHE_SYSFS) -> CpuInfo:
    """A CpuInfo read from a /proc/cpuinfo-style file and a sysfs cache directory."""
    fields = read_cpuinfo(cpuinfo)
    caches = read_cache_sizes(sysfs)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return CpuInfo(vendor=fields.get("vendor_id", ""), model_name=fields.get("model name", ""),
                   flags=frozenset(fields.get("flags", "").split()), l2_bytes=caches.get(2, 0),
                   l3_bytes=caches.get(3, 0), cores=cores)


@functools.lru_cache(maxsize=None)
def cpu_info() -> CpuInfo:
    """This machine's CPU, probed once per process."""
    return probe_cpu()
