"""The CPU vendor (`vendor_id` of /proc/cpuinfo), which picks the faster float32 linear packing (decisions §68)."""
from __future__ import annotations

import functools

CPUINFO = "/proc/cpuinfo"
INTEL = "GenuineIntel"


def read_cpu_vendor(path: str = CPUINFO) -> str:
    """The first `vendor_id` of a /proc/cpuinfo-style file ("" where there is none or it cannot be read)."""
    try:
        with open(path, encoding="utf-8") as handle:
            for line in handle:
                key, _, value = line.partition(":")
                if key.strip() == "vendor_id":
                    return value.strip()
    except OSError:
        pass
    return ""


@functools.lru_cache(maxsize=None)
def cpu_vendor() -> str:
    """This machine's CPU vendor, read once per process: "GenuineIntel", "AuthenticAMD", ... or ""."""
    return read_cpu_vendor()
