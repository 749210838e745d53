"""LoRA adapters of the engines a job builds (command lines, Ray replicas): ranks, rows' adapters, an engine wrapper."""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Dict, Mapping, Optional

from seq2seq_engine.engine_port import EnginePort
from seq2seq_engine.lora_request import SUPPORTED_RANKS, LoRARequest

DEFAULT_MAX_LORA_RANK = 16  # EngineArgs' default


def adapter_rank(path: str) -> int:
    """The engine's max_lora_rank an adapter needs: its highest rank (adapter_config.json's `r` and
    `rank_pattern`) rounded up to a supported one; the default when the file cannot be read (the engine then says
    what is wrong with it) or the rank is above every supported one (the engine refuses it, naming the module)."""
    try:
        with open(os.path.join(path, "adapter_config.json"), encoding="utf-8") as handle:
            config = json.load(handle)
        ranks = [int(config.get("r", 8))] + [int(r) for r in (config.get("rank_pattern") or {}).values()]
    except (OSError, ValueError, TypeError, AttributeError):
        return DEFAULT_MAX_LORA_RANK
    return next((rank for rank in SUPPORTED_RANKS if rank >= max(ranks)), DEFAULT_MAX_LORA_RANK)


def lora_engine_kwargs(paths: Any, engine_kwargs: Mapping[str, Any]) -> Dict[str, Any]:
    """The engine's keyword arguments to serve the adapters at `paths`: enable_lora, and max_lora_rank large enough
    for each, unless `engine_kwargs` sets them."""
    paths = [path for path in paths if path]
    if not paths:
        return dict(engine_kwargs)
    return {"enable_lora": True, "max_lora_rank": max(adapter_rank(path) for path in paths), **dict(engine_kwargs)}


@dataclasses.dataclass(frozen=True)
class AdaptedPrompt:
    """A prompt with the LoRA adapter its request runs with (None: the base model), for AdapterEngine."""

    prompt: Any
    lora_request: Optional[LoRARequest]


class AdapterEngine:
    """An EnginePort whose add_request runs each request with a LoRA adapter: the one its prompt carries (an
    AdaptedPrompt), else the one passed, else `default`; everything else is the engine's. It lets a driver that
    only queues (prompt, params), such as engine.streaming.stream_in_order, run adapters."""

    def __init__(self, engine: EnginePort, default: Optional[LoRARequest] = None) -> None:
        self.engine, self.default = engine, default

    def add_request(self, request_id: str, prompt: Any, params: Any = None, arrival_time: Optional[float] = None,
                    priority: int = 0, lora_request: Optional[LoRARequest] = None) -> None:
        if isinstance(prompt, AdaptedPrompt):
            prompt, lora_request = prompt.prompt, prompt.lora_request
        elif lora_request is None:
            lora_request = self.default
        adapter = {} if lora_request is None else {"lora_request": lora_request}
        self.engine.add_request(request_id, prompt, params, arrival_time, priority, **adapter)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)


class AdapterTable:
    """The adapters a replica's rows run with: `modules` by name ({name: directory}), any other directory by its
    path (relative ones read from `base_dir`), and `default` (a name or a directory) for rows that name none. Each
    is read into the engine when first named (ids 1, 2, ... in that order); one that cannot be served is a
    ValueError naming it, for every row that names it."""

    def __init__(self, engine: EnginePort, modules: Mapping[str, str], default: Optional[str] = None,
                 base_dir: Optional[str] = None) -> None:
        self.engine, self.modules = engine, dict(modules)
        self.base_dir = base_dir or os.getcwd()
        self._requests: Dict[str, LoRARequest] = {}
        self._errors: Dict[str, str] = {}
        self.default = self.request_for(default) if default is not None else None  # a bad one fails the replica

    def request_for(self, value: Any) -> Optional[LoRARequest]:
        """The LoRARequest of a row's `lora` value (None: the default)."""
        if value is None:
            return self.default
        if not isinstance(value, str) or not value:
            raise TypeError(f"a row's 'lora' must be an adapter name or directory, got {value!r}")
        name, path = (value, self.modules[value]) if value in self.modules else (value, value)
        path = os.path.normpath(os.path.join(self.base_dir, path))
        if path in self._errors:
            raise ValueError(self._errors[path])
        if path not in self._requests:
            request = LoRARequest(name, len(self._requests) + 1, path)
            try:
                self.engine.add_lora(request)
            except ValueError as error:
                known = f" (named adapters: {sorted(self.modules)})" if value not in self.modules else ""
                self._errors[path] = f"lora {value!r}{known}: {error}"
                raise ValueError(self._errors[path]) from None
            self._requests[path] = request
        return self._requests[path]
