"""The servers the load benchmark drives: `seq2seq-engine serve` as a child process (a free loopback port, its own
OpenMP thread count, ready once /health answers, KV blocks read from /metrics, stopped with SIGTERM), or the same
server on a background thread of this process (`InProcessServer`)."""
from __future__ import annotations

import dataclasses
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import httpx

from seq2seq_engine.engine.arg_utils import EngineArgs
from seq2seq_engine.engine.llm_engine import LLMEngine
from seq2seq_engine.entrypoints.openai.server import RunningServer, start_in_thread
from seq2seq_engine.entrypoints.openai.state import ServerSettings

_METRIC_LINE = re.compile(r'^seq2seq_engine:(\w+)\{model_name="([^"]*)"\} ([0-9.eE+-]+)$')


@dataclasses.dataclass
class ServerProcess:
    """A `serve` child process (one or several models): its URL, the process handle and its output file."""

    name: str
    url: str
    process: subprocess.Popen
    log_path: str

    def metrics(self, model_name: str) -> Dict[str, float]:
        """A model's gauges and counters of GET /metrics, by name (without the seq2seq_engine: prefix)."""
        text = httpx.get(f"{self.url}/metrics", timeout=30).text
        values = {}
        for line in text.splitlines():
            match = _METRIC_LINE.match(line)
            if match and match.group(2) == model_name:
                values[match.group(1)] = float(match.group(3))
        return values

    def cpu_seconds(self) -> float:
        """User + system CPU time of the server process so far (all its threads), from /proc."""
        with open(f"/proc/{self.process.pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def held_blocks(self, model_name: str, timeout: float = 60) -> int:
        """A model's device KV blocks still held once none of its requests is running, waiting or swapped (0: every
        block is back)."""
        def read() -> Tuple[int, int]:
            values = self.metrics(model_name)
            queues = ("num_requests_running", "num_requests_waiting", "num_requests_swapped")
            busy = sum(values.get(name, 0) for name in queues)
            return int(busy), int(values["kv_cache_total_blocks"] - values["kv_cache_free_blocks"])
        return wait_for_free_blocks(read, timeout)

    def stop(self, timeout: float = 30) -> int:
        """SIGTERM, as a service manager stops it; the exit status (killed if it outlives the timeout)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode


def wait_for_free_blocks(read: Callable[[], Tuple[int, int]], timeout: float) -> int:
    """Poll read() -> (unfinished requests, held blocks) until both are 0 or `timeout` passes; the blocks held."""
    deadline = time.monotonic() + timeout
    unfinished, held = read()
    while (unfinished or held) and time.monotonic() < deadline:
        time.sleep(0.2)
        unfinished, held = read()
    return held


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


@dataclasses.dataclass
class InProcessServer:
    """The same server on a background thread of this process."""

    running: RunningServer

    @property
    def url(self) -> str:
        return self.running.url

    def held_blocks(self, model_name: str, timeout: float = 60) -> int:
        """The same, read on the model's engine loop thread between two steps."""
        def read_engine(engine) -> Tuple[int, int]:
            manager = engine.scheduler.block_manager
            held = manager.num_total_gpu_blocks - manager.get_num_free_gpu_blocks()
            return engine.get_num_unfinished_requests(), held
        loop = self.running.models.resolve(model_name).loop
        return wait_for_free_blocks(lambda: loop.call(read_engine).result(), timeout)

    def stop(self) -> None:
        self.running.stop()


def start_in_process(models: Dict[str, str], engine_kwargs: Dict[str, Any]) -> InProcessServer:
    engines = {name: LLMEngine.from_engine_args(EngineArgs(model=path, **engine_kwargs))
               for name, path in models.items()}
    return InProcessServer(start_in_thread(engines, ServerSettings(host="127.0.0.1", port=0)))


def start_server(models: Dict[str, str], engine_flags: List[str], threads: Optional[int],
                 timeout: float = 300) -> ServerProcess:
    """`python -m seq2seq_engine.entrypoints.cli serve PATH... --served-model-name NAME... --port P ...` for
    {served name: model path}, with OMP_NUM_THREADS=threads (None: torch's default, one per core); returns once
    /health answers 200."""
    port = free_port()
    env = dict(os.environ)
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    name = "+".join(models)
    command = [sys.executable, "-m", "seq2seq_engine.entrypoints.cli", "serve", *models.values(), "--host",
               "127.0.0.1", "--port", str(port), "--served-model-name", *models, *engine_flags]
    log = tempfile.NamedTemporaryFile("w+", prefix=f"serve-{name}-", suffix=".log", delete=False)
    process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    server = ServerProcess(name, f"http://127.0.0.1:{port}", process, log.name)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            log.seek(0)
            raise RuntimeError(f"`serve {name}` exited with {process.returncode}: {log.read()[-2000:]}")
        try:
            if httpx.get(f"{server.url}/health", timeout=2).status_code == 200:
                return server
        except httpx.TransportError:
            pass
        time.sleep(0.3)
    server.stop()
    raise RuntimeError(f"`serve {name}` did not answer /health within {timeout:.0f} s")
