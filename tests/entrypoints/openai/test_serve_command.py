"""`seq2seq-engine serve` as a process: it logs its URL, answers, and SIGTERM / SIGINT end it with status 0 while a
streamed request is in flight (the stream ends with an error event and [DONE], not left hanging)."""
import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest
from conftest import require_model

MODEL = "smollm2-135m"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _start(port: int) -> subprocess.Popen:
    command = [sys.executable, "-m", "seq2seq_engine.entrypoints.cli", "serve", MODEL, "--port", str(port),
               "--kv-cache-space-gb", "0.3", "--swap-space-gb", "0.01", "--max-num-seqs", "4"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)


def _wait_for_url(process: subprocess.Popen, port: int) -> list:
    lines = []
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            break
        lines.append(line)
        if f"http://127.0.0.1:{port}" in line:
            return lines
    process.kill()
    pytest.fail("the server logged no URL:\n" + "".join(lines))


@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGINT])
def test_serve_logs_its_url_and_stops_cleanly_on_a_signal(stop_signal):
    require_model(MODEL)
    port = _free_port()
    process = _start(port)
    try:
        _wait_for_url(process, port)
        url = f"http://127.0.0.1:{port}"
        for _ in range(100):  # the log line comes just before uvicorn binds
            try:
                if httpx.get(f"{url}/health").status_code == 200:
                    break
            except httpx.ConnectError:
                time.sleep(0.1)
        body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 2000, "temperature": 0, "stream": True}
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as response:
            lines = response.iter_lines()
            assert next(lines).startswith("data: ")
            process.send_signal(stop_signal)
            rest = [line for line in lines if line]  # the stream ends at once instead of hanging
        assert rest[-1] == "data: [DONE]" and "shutting down" in rest[-2] and len(rest) < 1999
        assert process.wait(timeout=60) == 0
        assert "server stopped" in process.stdout.read()
    finally:
        if process.poll() is None:
            process.kill()
