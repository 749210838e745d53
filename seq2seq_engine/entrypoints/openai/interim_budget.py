"""How often the realtime sockets of one engine may start an interim decode: at most one per period of wall time,
whatever the number of streams, so interim text never takes the capacity the turns' final decodes need."""
from __future__ import annotations

import threading
import time
from typing import Optional

# One stream's ticks come every second of its audio (LiveOptions.interim_interval_s), give or take a chunk: a period
# a little shorter lets every one of them through; N streams share about one interim decode a second.
INTERIM_PERIOD_S = 0.8


class InterimBudget:
    """`take()` is True at most once per `period_s` (the caller then starts an interim decode); thread-safe."""

    def __init__(self, period_s: float = INTERIM_PERIOD_S) -> None:
        if not period_s >= 0:
            raise ValueError(f"period_s must be >= 0, got {period_s!r}")
        self.period_s = period_s
        self._next = float("-inf")
        self._lock = threading.Lock()

    def take(self, now: Optional[float] = None) -> bool:
        now = time.monotonic() if now is None else now
        with self._lock:
            if now < self._next:
                return False
            self._next = now + self.period_s
            return True
