"""Running the server: load the engine, start its loop thread, serve the app with uvicorn; SIGINT/SIGTERM stop
accepting, abort what is in flight and exit. `start_in_thread` runs the same server on a background thread."""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import signal
import socket
import threading
import time
from typing import Any

import uvicorn

from seq2seq_engine.entrypoints.openai.app import build_app
from seq2seq_engine.entrypoints.openai.engine_loop import EngineLoop
from seq2seq_engine.entrypoints.openai.metrics import ServerMetrics
from seq2seq_engine.entrypoints.openai.state import ServerSettings, ServerState

logger = logging.getLogger(__name__)


def make_state(engine: Any, model_name: str, settings: ServerSettings) -> ServerState:
    metrics = ServerMetrics(model_name)
    return ServerState(EngineLoop(engine, metrics), metrics, model_name, settings)


class _Server(uvicorn.Server):
    """uvicorn's server, which at shutdown first stops the engine loop: requests in flight end at once (a stream
    gets an error event and [DONE], a waiting request a 503) instead of running into the graceful timeout."""

    def __init__(self, config: uvicorn.Config, state: ServerState) -> None:
        super().__init__(config)
        self.state = state

    async def shutdown(self, sockets: Any = None) -> None:
        self.state.loop.stop(timeout=30)
        await super().shutdown(sockets)


def _uvicorn_server(state: ServerState) -> uvicorn.Server:
    config = uvicorn.Config(build_app(state), host=state.settings.host, port=state.settings.port,
                            log_level="warning", timeout_graceful_shutdown=5, lifespan="off")
    return _Server(config, state)


def serve(engine: Any, model_name: str, settings: ServerSettings) -> None:
    """Serve until SIGINT/SIGTERM (uvicorn's handlers end the serve loop); then the engine loop aborts what is left."""
    state = make_state(engine, model_name, settings)
    server = _uvicorn_server(state)
    state.loop.start()
    # uvicorn handles SIGINT/SIGTERM (stop accepting, let running responses finish for up to 5 s), then raises the
    # signal again once its own handlers are gone: SIGTERM then ends here as SystemExit, so the loop stops cleanly.
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        logger.warning("serving %s on http://%s:%d (OpenAI API under /v1; Ctrl-C stops)", model_name,
                       settings.host, settings.port)
        server.run()
    finally:
        state.loop.stop(timeout=30)
        signal.signal(signal.SIGTERM, previous)
        logger.warning("server stopped")


def _exit_on_sigterm(signum: int, frame: Any) -> None:
    raise SystemExit(0)


@dataclasses.dataclass
class RunningServer:
    """A server on a background thread (tests, benchmarks): `url`, `state`, and `stop()`."""

    state: ServerState
    server: uvicorn.Server
    thread: threading.Thread
    url: str

    def stop(self, timeout: float = 30) -> None:
        self.server.should_exit = True
        self.thread.join(timeout)
        self.state.loop.stop(timeout)


def start_in_thread(engine: Any, model_name: str, settings: ServerSettings, timeout: float = 60) -> RunningServer:
    """Bind (port 0: a free port), start the engine loop and uvicorn on a thread, and wait until it accepts."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((settings.host, settings.port))
    port = sock.getsockname()[1]
    settings = dataclasses.replace(settings, port=port)
    state = make_state(engine, model_name, settings)
    server = _uvicorn_server(state)
    state.loop.start()
    thread = threading.Thread(target=lambda: asyncio.run(server.serve(sockets=[sock])), name="uvicorn",
                              daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            state.loop.stop(5)
            raise RuntimeError(f"the server did not start on {settings.host}:{port}")
        time.sleep(0.05)
    return RunningServer(state, server, thread, f"http://{settings.host}:{port}")
