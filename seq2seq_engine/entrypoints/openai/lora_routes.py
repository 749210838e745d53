"""POST /v1/load_lora_adapter and /v1/unload_lora_adapter: vLLM's runtime LoRA routes, run on the engine's thread."""
from __future__ import annotations

import asyncio
import logging
import os
from typing import Any, Callable, Optional

from fastapi import FastAPI
from fastapi.responses import PlainTextResponse

from seq2seq_engine.engine_port import EnginePort
from seq2seq_engine.entrypoints.openai.errors import APIError, check_size
from seq2seq_engine.entrypoints.openai.limits import MAX_LORA_NAME_CHARS, MAX_LORA_PATH_CHARS
from seq2seq_engine.entrypoints.openai.lora_registry import Adapter
from seq2seq_engine.entrypoints.openai.protocol import LoadLoRAAdapterRequest, UnloadLoRAAdapterRequest
from seq2seq_engine.entrypoints.openai.state import ServedModels, ServerState
from seq2seq_engine.errors import LoRAAdapterError

logger = logging.getLogger(__name__)


def add_lora_routes(app: FastAPI, models: ServedModels) -> None:
    lock = asyncio.Lock()  # one change at a time: a name is checked and registered without another change between
    logger.warning("runtime LoRA updating is on: POST /v1/load_lora_adapter reads any adapter directory this "
                   "process can read; do not expose this server to untrusted clients")

    @app.post("/v1/load_lora_adapter")
    async def load_lora_adapter(body: LoadLoRAAdapterRequest) -> PlainTextResponse:
        name = _checked_name(body.lora_name)
        check_size("lora_path", len(body.lora_path), MAX_LORA_PATH_CHARS, "characters")
        if not body.lora_path.strip():
            raise APIError("lora_path must be the adapter's directory", param="lora_path")
        async with lock:
            state = _base(models, body.base_model_name)
            if name in models.names or name in models.loras.adapters:
                raise APIError(f"The lora adapter {name!r} has already been loaded (or names a served model).",
                               param="lora_name", code="lora_adapter_exists")
            request = models.loras.new_request(name, os.path.abspath(body.lora_path))
            await _on_engine(state, lambda engine: engine.add_lora(request), name)
            models.loras.add(request, state.model_name)
        logger.info("LoRA adapter %s (id %d) loaded on %s from %s", name, request.lora_int_id, state.model_name,
                    request.lora_path)
        return PlainTextResponse(f"Success: LoRA adapter '{name}' added successfully.")

    @app.post("/v1/unload_lora_adapter")
    async def unload_lora_adapter(body: UnloadLoRAAdapterRequest) -> PlainTextResponse:
        if body.lora_name is None and body.lora_int_id is None:
            raise APIError("send lora_name (or lora_int_id) of the adapter to unload", param="lora_name")
        if body.lora_name is not None:
            check_size("lora_name", len(body.lora_name), MAX_LORA_NAME_CHARS, "characters")
        async with lock:
            adapter = models.loras.find(body.lora_name, body.lora_int_id)
            if adapter is None:
                shown = body.lora_name if body.lora_name is not None else f"id {body.lora_int_id}"
                raise APIError(f"The lora adapter '{shown}' cannot be found.", 404,
                               param="lora_name" if body.lora_name is not None else "lora_int_id",
                               code="lora_adapter_not_found")
            await _unload(models, adapter)
        logger.info("LoRA adapter %s (id %d) unloaded", adapter.name, adapter.request.lora_int_id)
        return PlainTextResponse(f"Success: LoRA adapter '{adapter.name}' removed successfully.")


def _checked_name(name: str) -> str:
    check_size("lora_name", len(name), MAX_LORA_NAME_CHARS, "characters")
    if not name.strip() or name != name.strip():
        raise APIError(f"lora_name must be a non-empty name without surrounding spaces, got {name!r}",
                       param="lora_name")
    return name


def _base(models: ServedModels, name: Optional[str]) -> ServerState:
    """The served model an adapter is loaded on (the first one when none is named)."""
    if name is None:
        return models.states[0]
    check_size("base_model_name", len(name), MAX_LORA_NAME_CHARS, "characters")
    try:
        return models.base(name)
    except KeyError:
        raise APIError(f"the base model {name!r} is not served; this server serves {list(models.names)}", 404,
                       param="base_model_name", code="model_not_found") from None


async def _on_engine(state: ServerState, fn: Callable[[EnginePort], Any], name: str) -> Any:
    """fn(engine) on the model's engine loop thread, between two steps; an adapter it refuses is a 400."""
    if not state.loop.alive:
        raise APIError("the server is shutting down", 503)
    try:
        return await asyncio.wrap_future(state.loop.call(fn))
    except LoRAAdapterError as error:  # missing or malformed files, or a module the engine does not adapt
        raise APIError(f"cannot load LoRA adapter {name!r}: {error}", param="lora_path",
                       code="invalid_lora_adapter") from None
    except ValueError as error:  # the engine was built without enable_lora
        raise APIError(f"the model {state.model_name!r} serves no LoRA adapters (start the server with "
                       f"--enable-lora): {error}", param="base_model_name") from None


async def _unload(models: ServedModels, adapter: Adapter) -> None:
    """Forget the adapter, unless a transcription, realtime session or engine request still runs with it (400)."""
    holders = models.loras.holders(adapter.name)
    if holders:
        raise APIError(f"the LoRA adapter {adapter.name!r} is in use by {holders} running transcription(s) or "
                       f"realtime session(s); unload it once they end", param="lora_name", code="lora_adapter_in_use")
    models.loras.remove(adapter.name)  # requests naming it from now on get a 404
    lora_int_id = adapter.request.lora_int_id
    try:
        removed = await _on_engine(models.base(adapter.base), lambda engine: engine.remove_lora(lora_int_id),
                                   adapter.name)
    except BaseException:
        models.loras.restore(adapter)
        raise
    if not removed:
        models.loras.restore(adapter)
        raise APIError(f"the LoRA adapter {adapter.name!r} is in use by running requests; unload it once they "
                       f"finish", param="lora_name", code="lora_adapter_in_use")
