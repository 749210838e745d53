"""Helpers of the server tests: a real uvicorn server on 127.0.0.1 (a free port) over a real engine, on a
background thread, and the engine's block pools read on its loop thread."""
from __future__ import annotations

import contextlib
import time
from typing import Any, Dict, Iterator, Optional, Tuple

from seq2seq_engine.engine.arg_utils import EngineArgs
from seq2seq_engine.engine.llm_engine import LLMEngine
from seq2seq_engine.entrypoints.openai.server import RunningServer, start_in_thread
from seq2seq_engine.entrypoints.openai.state import ServerSettings

API_KEY = "test-key"
# Small pools keep the tests light (the house settings for real-model tests).
SMALL_POOLS = dict(kv_cache_space_gb=0.3, swap_space_gb=0.01)


CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}assistant:{% endif %}")


def tiny_chat_llama(root: Any, spm_tokenizer: Any) -> Tuple[str, Any]:
    """(directory, HF model): a random tiny Llama with the sentencepiece tokenizer and a plain chat template."""
    import transformers
    from hf_reference import build_tiny_model

    model_dir, hf_model = build_tiny_model("llama", root, vocab_size=len(spm_tokenizer))
    spm_tokenizer.save_pretrained(model_dir)
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(model_dir)
    return model_dir, hf_model


def build_engine(model_dir: str, **kwargs: Any) -> LLMEngine:
    return LLMEngine.from_engine_args(EngineArgs(model=model_dir, **{**SMALL_POOLS, **kwargs}))


@contextlib.contextmanager
def running_server(engine: LLMEngine, model_name: str, **settings: Any) -> Iterator[RunningServer]:
    with running_models({model_name: engine}, **settings) as server:
        yield server


@contextlib.contextmanager
def running_models(engines: Dict[str, LLMEngine], loras: Any = None, **settings: Any) -> Iterator[RunningServer]:
    """One server for several models ({served name: engine}) and the LoRA adapters `loras` (a LoRARegistry)."""
    server = start_in_thread(engines, ServerSettings(host="127.0.0.1", port=0, **settings), loras=loras)
    try:
        yield server
    finally:
        server.stop()


def pool_state(server: RunningServer, model_name: Optional[str] = None) -> dict:
    """Free and total device blocks, cross tables and unfinished requests of a model (the only one when None),
    read between two engine steps."""
    def read(engine: Any) -> dict:
        manager = engine.scheduler.block_manager
        return {"free": manager.get_num_free_gpu_blocks(), "total": manager.num_total_gpu_blocks,
                "cross_tables": len(manager.cross_block_tables), "self_tables": len(manager.block_tables),
                "unfinished": engine.get_num_unfinished_requests()}
    return server.models.resolve(model_name).loop.call(read).result(timeout=30)


def wait_until_idle(server: RunningServer, model_name: Optional[str] = None, timeout: float = 60) -> dict:
    """The pool state of a model (the only one when None) once its engine holds no request (or the last state read
    when `timeout` passes)."""
    deadline = time.monotonic() + timeout
    state = pool_state(server, model_name)
    while state["unfinished"] and time.monotonic() < deadline:
        time.sleep(0.1)
        state = pool_state(server, model_name)
    return state
