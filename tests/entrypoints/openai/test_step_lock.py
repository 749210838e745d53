"""StepLock: turns in the order they were asked for; two servers in one process sharing one never step at once."""
import concurrent.futures
import threading
import time

import httpx
import pytest
from conftest import require_model
from server_utils import build_engine

from seq2seq_engine.entrypoints.openai.server import start_in_thread
from seq2seq_engine.entrypoints.openai.state import ServerSettings
from seq2seq_engine.entrypoints.openai.step_lock import StepLock


def _wait_for(condition, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def test_turns_go_in_the_order_asked_even_to_a_thread_that_asks_again():
    lock, order = StepLock(), []

    def take(name):
        with lock:
            order.append(name)

    lock.__enter__()
    first = threading.Thread(target=take, args=("first",))
    first.start()
    _wait_for(lambda: len(lock._waiting) == 1)
    second = threading.Thread(target=take, args=("second",))
    second.start()
    _wait_for(lambda: len(lock._waiting) == 2)
    lock.__exit__(None, None, None)
    take("holder again")  # asks after the two waiting threads: gets the third turn, not the next one
    first.join(5), second.join(5)
    assert order == ["first", "second", "holder again"]
    with lock:  # free again: taken at once
        assert not lock._waiting


def test_two_servers_sharing_a_lock_step_one_at_a_time():
    engines = [build_engine(require_model("smollm2-135m"), max_num_seqs=4) for _ in range(2)]
    stepping, overlaps, steps = [], [], []
    for engine in engines:
        real_step = engine.step

        def step(real_step=real_step):
            stepping.append(1)
            overlaps.append(len(stepping))
            time.sleep(0.002)  # a step long enough that an unlocked neighbour would overlap it
            outputs = real_step()
            stepping.pop()
            steps.append(1)
            return outputs
        engine.step = step
    lock = StepLock()
    servers = [start_in_thread(engine, "smollm2-135m", ServerSettings(host="127.0.0.1", port=0), step_lock=lock)
               for engine in engines]
    try:
        def complete(url):
            body = {"model": "smollm2-135m", "prompt": "Count: one, two,", "max_tokens": 12, "temperature": 0}
            return httpx.post(f"{url}/v1/completions", json=body, timeout=120).json()["choices"][0]["text"]

        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            texts = list(pool.map(complete, [s.url for s in servers] * 2))
    finally:
        for server in servers:
            server.stop()
    assert len(set(texts)) == 1 and texts[0]
    assert len(steps) >= 12 and max(overlaps) == 1


@pytest.mark.parametrize("holders", [2, 3])
def test_every_thread_gets_turns_under_contention(holders):
    lock, counts, stop = StepLock(), [0] * holders, threading.Event()
    start = threading.Barrier(holders + 1)

    def loop(index):
        start.wait()
        while not stop.is_set():
            with lock:
                counts[index] += 1
                time.sleep(0.001)  # a step releases the GIL while torch works

    threads = [threading.Thread(target=loop, args=(i,)) for i in range(holders)]
    for thread in threads:
        thread.start()
    start.wait()
    time.sleep(0.3)
    stop.set()
    for thread in threads:
        thread.join(5)
    assert min(counts) > 0.8 * max(counts)
