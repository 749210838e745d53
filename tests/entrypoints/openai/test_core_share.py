"""The cores of a server process shared by its engine loops: a loop steps with all of the threads while it is the
only one with work and with its share while others have work too, set on its own thread only."""
import threading
import time

import pytest
import torch

from seq2seq_engine.entrypoints.openai.core_share import CoreShare
from seq2seq_engine.entrypoints.openai.engine_loop import EngineLoop


class _RecordingEngine:
    """Runs `steps` steps (10 ms each) per added request and records the thread count each step ran with."""

    def __init__(self, steps: int) -> None:
        self.steps, self.pending, self.seen = steps, 0, []

    def add_request(self, request_id, prompt, params):
        self.pending += self.steps

    def has_unfinished_requests(self):
        return self.pending > 0

    def step(self):
        self.seen.append(torch.get_num_threads())
        time.sleep(0.01)
        self.pending -= 1
        return []

    def abort_request(self, request_ids):
        self.pending = 0

    def unfinished_request_ids(self):
        return []


class _NoMetrics:
    def __getattr__(self, name):
        return lambda *args: None


class _Sink(list):
    put = list.append


def test_core_share_divides_the_threads_among_busy_members():
    share = CoreShare(4)
    assert share.threads_for_step("a") == 4
    assert share.threads_for_step("b") == 2 and share.threads_for_step("a") == 2
    assert share.threads_for_step("c") == 1 and share.num_busy == 3
    share.release("b")
    share.release("c")
    share.release("c")  # releasing twice is harmless
    assert share.threads_for_step("a") == 4 and share.num_busy == 1
    for bad in (0, -1, 2.0, None):
        with pytest.raises(ValueError, match="total_threads"):
            CoreShare(bad)


def test_a_thread_count_set_on_one_thread_leaves_the_others_alone():
    """What the sharing rests on: torch's thread count belongs to the calling thread, once that thread has read it
    (its first read initialises it from the last value set on any thread)."""
    results = {}
    other_ready, changed = threading.Event(), threading.Event()

    def other():
        torch.get_num_threads()
        torch.set_num_threads(3)
        other_ready.set()
        changed.wait(10)
        results["other"] = torch.get_num_threads()

    def changer():
        other_ready.wait(10)
        torch.set_num_threads(1)
        results["changer"] = torch.get_num_threads()
        changed.set()

    threads = [threading.Thread(target=other), threading.Thread(target=changer)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    assert results == {"other": 3, "changer": 1}


def test_engine_loops_step_with_their_share_while_both_have_work():
    share = CoreShare(4)
    long_engine, short_engine = _RecordingEngine(steps=100), _RecordingEngine(steps=5)
    loops = [EngineLoop(engine, _NoMetrics(), share) for engine in (long_engine, short_engine)]
    for loop in loops:
        loop.start()
    try:
        loops[0].add_request("r0", None, None, _Sink())
        deadline = time.monotonic() + 30
        # the short request only once the long one is running (on a loaded machine the long loop's thread may
        # otherwise start after the short one has finished)
        while not long_engine.seen and time.monotonic() < deadline:
            time.sleep(0.005)
        loops[1].add_request("r1", None, None, _Sink())
        while (len(long_engine.seen), len(short_engine.seen)) != (100, 5) and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        for loop in loops:
            loop.stop(10)
    assert len(long_engine.seen) == 100 and len(short_engine.seen) == 5
    assert short_engine.seen[0] == 2 and 2 in long_engine.seen  # both busy: half each
    assert long_engine.seen[-1] == 4  # alone again once the short one went idle
    assert share.num_busy == 0
