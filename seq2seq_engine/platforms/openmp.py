"""OpenMP settings applied before torch is first imported (only where the user has not set them).

torch's CPU kernels (and the engine's native kernels, which share torch's OpenMP pool) run on libgomp threads.
libgomp's default lets an idle thread spin for ~3 ms before it sleeps; when the machine also runs other work, a
spinning thread burns the core its descheduled sibling needs, and every parallel region waits for a scheduler time
slice: measured on 2 cores at a load of ~6, a Whisper tiny.en run went from 2.4 s (1 thread) to 31.5 s (2 threads,
default spinning). Sleeping at once (OMP_WAIT_POLICY=PASSIVE) fixes that but makes every barrier inside a matmul a
futex wake-up, 2-7% of a SmolLM2 step on an idle machine. A short spin of GOMP_SPINCOUNT=10000 iterations
(~0.1 ms) keeps threads awake between the kernels of one step and still sleeps between steps: as fast as PASSIVE
at a load of 4, 2-7% faster idle (docs/performance.md §3). A user's OMP_WAIT_POLICY or GOMP_SPINCOUNT always wins.
"""
from __future__ import annotations

import os
import sys

SPIN_COUNT = "10000"


def apply_openmp_defaults() -> bool:
    """Set GOMP_SPINCOUNT unless the user chose a wait policy or spin count; True if it can still take effect
    (torch not yet imported: OpenMP reads it once, when torch loads it)."""
    if "OMP_WAIT_POLICY" not in os.environ:
        os.environ.setdefault("GOMP_SPINCOUNT", SPIN_COUNT)
    return "torch" not in sys.modules
