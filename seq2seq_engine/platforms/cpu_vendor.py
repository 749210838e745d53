"""/proc/cpuinfo's first processor, and the CPU vendor from it, which picks the faster float32 linear packing
(decisions §68)."""
from __future__ import annotations

import functools
from typing import Dict

CPUINFO = "/proc/cpuinfo"
INTEL = "GenuineIntel"


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


def read_cpu_vendor(path: str = CPUINFO) -> str:
    """The first processor's `vendor_id` ("" where there is none or the file cannot be read)."""
    return read_cpuinfo(path).get("vendor_id", "")


@functools.lru_cache(maxsize=None)
def cpu_vendor() -> str:
    """This machine's CPU vendor, read once per process: "GenuineIntel", "AuthenticAMD", ... or ""."""
    return read_cpu_vendor()
