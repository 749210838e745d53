"""Helpers of the server tests: a real uvicorn server on 127.0.0.1 (a free port) over a real engine, on a
background thread, and the engine's block pools read on its loop thread."""
from __future__ import annotations

import contextlib
import time
from typing import Any, Iterator

from seq2seq_engine.engine.arg_utils import EngineArgs
from seq2seq_engine.engine.llm_engine import LLMEngine
from seq2seq_engine.entrypoints.openai.server import RunningServer, start_in_thread
from seq2seq_engine.entrypoints.openai.state import ServerSettings

API_KEY = "test-key"
# Small pools keep the tests light (the house settings for real-model tests).
SMALL_POOLS = dict(kv_cache_space_gb=0.3, swap_space_gb=0.01)


def build_engine(model_dir: str, **kwargs: Any) -> LLMEngine:
    return LLMEngine.from_engine_args(EngineArgs(model=model_dir, **{**SMALL_POOLS, **kwargs}))


@contextlib.contextmanager
def running_server(engine: LLMEngine, model_name: str, **settings: Any) -> Iterator[RunningServer]:
    server = start_in_thread(engine, model_name, ServerSettings(host="127.0.0.1", port=0, **settings))
    try:
        yield server
    finally:
        server.stop()


def pool_state(server: RunningServer) -> dict:
    """Free and total device blocks, cross tables and unfinished requests, read between two engine steps."""
    def read(engine: Any) -> dict:
        manager = engine.scheduler.block_manager
        return {"free": manager.get_num_free_gpu_blocks(), "total": manager.num_total_gpu_blocks,
                "cross_tables": len(manager.cross_block_tables), "self_tables": len(manager.block_tables),
                "unfinished": engine.get_num_unfinished_requests()}
    return server.state.loop.call(read).result(timeout=30)


def wait_until_idle(server: RunningServer, timeout: float = 60) -> dict:
    """The pool state once the engine holds no request (or the last state read when `timeout` passes)."""
    deadline = time.monotonic() + timeout
    state = pool_state(server)
    while state["unfinished"] and time.monotonic() < deadline:
        time.sleep(0.1)
        state = pool_state(server)
    return state
