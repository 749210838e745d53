"""OpenMP settings applied before torch is first imported (only where the user has not set them).

torch's CPU kernels run on OpenMP threads that, by default, spin-wait between parallel regions. When the machine
also runs other work (a second process, a test runner, a busy server), a spinning thread burns the core its
descheduled sibling needs, and every parallel region waits for a scheduler time slice: measured here on 2 cores
with a load of ~6, a Whisper tiny.en run went from 2.4 s (1 thread) to 31.5 s (2 spinning threads); with
OMP_WAIT_POLICY=PASSIVE it took 5.4 s, and at a load of ~2 the 16-clip run took 8.1 s instead of 21.0 s
(docs/performance.md). The engine issues many small kernels per decode step, so it is hit harder than a
single large matmul. PASSIVE makes idle threads sleep at once; set OMP_WAIT_POLICY=ACTIVE to get spinning back.
"""
from __future__ import annotations

import os
import sys

OPENMP_DEFAULTS = {"OMP_WAIT_POLICY": "PASSIVE"}


def apply_openmp_defaults() -> bool:
    """Set OPENMP_DEFAULTS in the environment where unset; True if they can still take effect (torch not yet
    imported: OpenMP reads them once, when torch loads it)."""
    for name, value in OPENMP_DEFAULTS.items():
        os.environ.setdefault(name, value)
    return "torch" not in sys.modules
