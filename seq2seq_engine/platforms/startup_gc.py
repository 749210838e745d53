"""One full garbage collection when an engine has been built, so that its first requests do not pay for them.

Importing torch and transformers and loading a model leave millions of objects that CPython's cyclic collector
tracks. CPython runs a full (oldest-generation) collection once the objects that survived the younger
collections since the last full one exceed a quarter of the objects the last one kept: right after start-up that
is the whole start-up heap, so the first engine steps, which make many short-lived objects, set off full
collections that walk all of it. Measured on the Marian-base int8 workload of `benchmarks/throughput.py` (in one
process, 2026-11-25): 0.19–0.21 s of collection inside the first `generate` call, 0.01 s inside the second.
One `gc.collect()` at the end of the engine's construction takes the same ~0.2 s there, out of the requests'
time, and leaves the counters as the second call found them. ``SEQ2SEQ_ENGINE_STARTUP_GC=0`` skips it.
"""
from __future__ import annotations

import gc

from seq2seq_engine.platforms.overrides import env_switch

STARTUP_GC_ENV = "SEQ2SEQ_ENGINE_STARTUP_GC"


def collect_startup_garbage() -> bool:
    """Run one full collection now (unless SEQ2SEQ_ENGINE_STARTUP_GC=0); whether it ran."""
    if not env_switch(STARTUP_GC_ENV):
        return False
    gc.collect()
    return True
