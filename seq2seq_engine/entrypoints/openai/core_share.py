"""The cores of one server process, shared by its engine loops: before each step a loop runs its own OpenMP team with
the process's threads divided among the loops that have work at that moment (decisions §61)."""
from __future__ import annotations

import threading
from typing import Hashable, Set


class CoreShare:
    """`threads_for_step(member)` marks the member busy and returns its share; `release(member)` when it goes idle.
    torch's thread count is per calling thread once that thread has read it (libgomp's nthreads ICV, MKL's local
    setting), so each loop sets its own share on its own thread without touching the others."""

    def __init__(self, total_threads: int) -> None:
        if not isinstance(total_threads, int) or total_threads < 1:
            raise ValueError(f"total_threads must be an int >= 1, got {total_threads!r}")
        self.total_threads = total_threads
        self._lock = threading.Lock()
        self._busy: Set[Hashable] = set()

    def threads_for_step(self, member: Hashable) -> int:
        with self._lock:
            self._busy.add(member)
            return max(1, self.total_threads // len(self._busy))

    def release(self, member: Hashable) -> None:
        with self._lock:
            self._busy.discard(member)

    @property
    def num_busy(self) -> int:
        with self._lock:
            return len(self._busy)
