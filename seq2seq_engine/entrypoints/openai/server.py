"""Running the server: one engine loop thread per served model (their steps share the process's cores), the app
served with uvicorn; SIGINT/SIGTERM stop accepting, abort what is in flight and exit. `start_in_thread` runs the
same server on a background thread."""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import signal
import socket
import threading
import time
from typing import Any, Mapping, Optional

import torch
import uvicorn

from seq2seq_engine.engine_port import EnginePort
from seq2seq_engine.entrypoints.openai.app import build_app
from seq2seq_engine.entrypoints.openai.core_share import CoreShare
from seq2seq_engine.entrypoints.openai.engine_loop import EngineLoop
from seq2seq_engine.entrypoints.openai.lora_registry import LoRARegistry
from seq2seq_engine.entrypoints.openai.metrics import MetricFamilies, ServerMetrics
from seq2seq_engine.entrypoints.openai.realtime.protocol import MAX_MESSAGE_BYTES
from seq2seq_engine.entrypoints.openai.state import ServedModels, ServerSettings, ServerState

logger = logging.getLogger(__name__)


def make_models(engines: Mapping[str, EnginePort], settings: ServerSettings,
                loras: Optional[LoRARegistry] = None) -> ServedModels:
    """A ServerState per (served name, engine), with one metrics registry and the process's threads shared by
    their loops; `loras`: the LoRA adapters read into the engines at start-up (lora_registry.load_adapters)."""
    families, cores = MetricFamilies(), CoreShare(torch.get_num_threads())
    states = []
    for model_name, engine in engines.items():
        metrics = ServerMetrics(model_name, families)
        states.append(ServerState(EngineLoop(engine, metrics, cores), metrics, model_name, settings))
    return ServedModels(tuple(states), settings, loras if loras is not None else LoRARegistry())


def _start_loops(models: ServedModels) -> None:
    for state in models.states:
        state.loop.start()


def _stop_loops(models: ServedModels, timeout: float) -> None:
    for state in models.states:
        state.loop.stop(timeout)


class _Server(uvicorn.Server):
    """uvicorn's server, which at shutdown first stops the engine loop: requests in flight end at once (a stream
    gets an error event and [DONE], a waiting request a 503) instead of running into the graceful timeout."""

    def __init__(self, config: uvicorn.Config, models: ServedModels) -> None:
        super().__init__(config)
        self.models = models

    async def shutdown(self, sockets: Any = None) -> None:
        _stop_loops(self.models, timeout=30)
        await super().shutdown(sockets)


def _uvicorn_server(models: ServedModels) -> uvicorn.Server:
    config = uvicorn.Config(build_app(models), host=models.settings.host, port=models.settings.port,
                            log_level="warning", timeout_graceful_shutdown=5, lifespan="off",
                            ws_max_size=MAX_MESSAGE_BYTES)
    return _Server(config, models)


def serve(engines: Mapping[str, EnginePort], settings: ServerSettings, loras: Optional[LoRARegistry] = None) -> None:
    """Serve {served name: engine} (and the LoRA adapters `loras`) until SIGINT/SIGTERM (uvicorn's handlers end the
    serve loop); then the engine loops abort what is left."""
    models = make_models(engines, settings, loras)
    server = _uvicorn_server(models)
    _start_loops(models)
    # uvicorn handles SIGINT/SIGTERM (stop accepting, let running responses finish for up to 5 s), then raises the
    # signal again once its own handlers are gone: SIGTERM then ends here as SystemExit, so the loop stops cleanly.
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        logger.warning("serving %s on http://%s:%d (OpenAI API under /v1%s; Ctrl-C stops)", ", ".join(models.names),
                       settings.host, settings.port, ", the browser page at /" if settings.ui else "")
        server.run()
    finally:
        _stop_loops(models, timeout=30)
        signal.signal(signal.SIGTERM, previous)
        logger.warning("server stopped")


def _exit_on_sigterm(signum: int, frame: Any) -> None:
    raise SystemExit(0)


@dataclasses.dataclass
class RunningServer:
    """A server on a background thread (tests, benchmarks): `url`, `models` (`state`: the first model's), `stop()`."""

    models: ServedModels
    server: uvicorn.Server
    thread: threading.Thread
    url: str

    @property
    def state(self) -> ServerState:
        return self.models.states[0]

    def stop(self, timeout: float = 30) -> None:
        self.server.should_exit = True
        self.thread.join(timeout)
        _stop_loops(self.models, timeout)


def start_in_thread(engines: Mapping[str, EnginePort], settings: ServerSettings, timeout: float = 60,
                    loras: Optional[LoRARegistry] = None) -> RunningServer:
    """Serve {served name: engine} (and the LoRA adapters `loras`): bind (port 0: a free port), start the engine
    loops and uvicorn on a thread, and wait until it accepts."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((settings.host, settings.port))
    port = sock.getsockname()[1]
    settings = dataclasses.replace(settings, port=port)
    models = make_models(engines, settings, loras)
    server = _uvicorn_server(models)
    _start_loops(models)
    thread = threading.Thread(target=lambda: asyncio.run(server.serve(sockets=[sock])), name="uvicorn",
                              daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            _stop_loops(models, 5)
            raise RuntimeError(f"the server did not start on {settings.host}:{port}")
        time.sleep(0.05)
    return RunningServer(models, server, thread, f"http://{settings.host}:{port}")
