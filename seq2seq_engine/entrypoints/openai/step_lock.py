"""StepLock: engines in one process take turns stepping, in the order they asked, so none is starved."""
from __future__ import annotations

import collections
import threading
from typing import Any, Deque


class StepLock:
    """A lock handed over first come, first served. `threading.Lock` is not fair: a loop thread that releases it
    and asks again at once usually gets it back before a waiting thread wakes, so one busy engine could hold the
    cores for long stretches while the other's requests wait. Use as `with lock: engine.step()`."""

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._waiting: Deque[threading.Lock] = collections.deque()
        self._held = False

    def __enter__(self) -> "StepLock":
        with self._mutex:
            if not self._held:
                self._held = True
                return self
            turn = threading.Lock()
            turn.acquire()
            self._waiting.append(turn)
        turn.acquire()  # released by the holder when it hands over; the lock stays held for us
        return self

    def __exit__(self, *exc_info: Any) -> None:
        with self._mutex:
            if self._waiting:
                self._waiting.popleft().release()
            else:
                self._held = False
