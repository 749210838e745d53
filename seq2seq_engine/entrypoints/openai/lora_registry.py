"""The server's LoRA adapters: --lora-modules parsed and checked, read at start-up, and the registry of those served."""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from seq2seq_engine.engine_port import EnginePort
from seq2seq_engine.lora_request import LoRARequest
from seq2seq_engine.platforms.overrides import override_value

logger = logging.getLogger(__name__)

# vLLM's switch for the runtime routes, and this engine's own name for it (either one, set to true, turns them on).
RUNTIME_UPDATING_ENV = ("SEQ2SEQ_ENGINE_ALLOW_RUNTIME_LORA_UPDATING", "VLLM_ALLOW_RUNTIME_LORA_UPDATING")
_TRUE = ("1", "true", "yes", "on")


@dataclasses.dataclass(frozen=True)
class LoRAModule:
    """One `--lora-modules` entry: served as `name`, read from `path`, on the served model `base_model_name`
    (None: the first served model)."""

    name: str
    path: str
    base_model_name: Optional[str] = None


def parse_lora_module(text: str) -> LoRAModule:
    """`name=path` or vLLM's JSON form `{"name": ..., "path": ..., "base_model_name": ...}` (argparse's type)."""
    if text.lstrip().startswith("{"):
        name, path, base = _json_module(text)
    else:
        name, separator, path = text.partition("=")
        base = None
        if not separator:
            raise ValueError(f"--lora-modules {text!r}: write name=path (or the JSON form)")
    if not name.strip() or not path.strip():
        raise ValueError(f"--lora-modules {text!r}: the name and the path must not be empty")
    return LoRAModule(name.strip(), path.strip(), base)


def _json_module(text: str) -> Tuple[str, str, Optional[str]]:
    try:
        fields = json.loads(text)
    except ValueError as error:
        raise ValueError(f"--lora-modules {text!r}: not valid JSON ({error})") from None
    unknown = sorted(set(fields) - {"name", "path", "base_model_name"}) if isinstance(fields, dict) else []
    texts = isinstance(fields, dict) and all(isinstance(fields.get(key), str) for key in ("name", "path")) and \
        isinstance(fields.get("base_model_name") or "", str)
    if unknown or not texts:
        raise ValueError(f"--lora-modules {text!r}: the JSON form is an object with string `name` and `path` and an "
                         f"optional string `base_model_name`{f', not {unknown}' if unknown else ''}")
    return fields["name"], fields["path"], fields.get("base_model_name")


def check_lora_modules(modules: Sequence[LoRAModule], served: Sequence[str], enable_lora: bool) -> List[LoRAModule]:
    """The modules with their base model filled in; ValueError for modules without --enable-lora, a name used twice
    or equal to a served model's, or a base model that is not served."""
    if modules and not enable_lora:
        raise ValueError("--lora-modules needs --enable-lora (the engines serve no adapters without it)")
    checked, names = [], set()
    for module in modules:
        if module.name in served:
            raise ValueError(f"--lora-modules: the adapter name {module.name!r} is a served model's name")
        if module.name in names:
            raise ValueError(f"--lora-modules: the adapter name {module.name!r} is given twice")
        if module.base_model_name is not None and module.base_model_name not in served:
            raise ValueError(f"--lora-modules: adapter {module.name!r} names the base model "
                             f"{module.base_model_name!r}, which is not served (served: {list(served)})")
        names.add(module.name)
        checked.append(dataclasses.replace(module, base_model_name=module.base_model_name or served[0]))
    return checked


def runtime_updating_allowed(flag: bool) -> bool:
    """--allow-runtime-lora-updating, or one of RUNTIME_UPDATING_ENV set to true."""
    own, vllm = RUNTIME_UPDATING_ENV
    return flag or override_value(own).lower() in _TRUE or os.environ.get(vllm, "").strip().lower() in _TRUE


@dataclasses.dataclass(frozen=True)
class Adapter:
    """A served adapter: its LoRARequest (name, id, path) on the served model `base`."""

    request: LoRARequest
    base: str
    created: int = dataclasses.field(default_factory=lambda: int(time.time()))

    @property
    def name(self) -> str:
        return self.request.lora_name


class LoRARegistry:
    """The adapters the server serves, by name, all models together: changed only on the event loop (start-up
    before it runs, the runtime routes on it), read by every handler. Ids run 1, 2, ... in the order adapters are
    registered and are never given twice (the engine's caches key by id). `hold` counts the transcription jobs and
    realtime sockets running with an adapter, whose engine requests come after their admission, so that an
    adapter is not unloaded under them."""

    def __init__(self) -> None:
        self.adapters: Dict[str, Adapter] = {}
        self._next_id = 1
        self._holders: Dict[str, int] = {}

    def new_request(self, name: str, path: str) -> LoRARequest:
        """The LoRARequest the next adapter registered gets."""
        return LoRARequest(name, self._next_id, path)

    def add(self, request: LoRARequest, base: str) -> Adapter:
        adapter = Adapter(request, base)
        self.adapters[request.lora_name] = adapter
        self._next_id = max(self._next_id, request.lora_int_id + 1)
        return adapter

    def remove(self, name: str) -> Adapter:
        return self.adapters.pop(name)

    def restore(self, adapter: Adapter) -> None:
        """Serve a removed adapter again, as it was (an unload the engine refused)."""
        self.adapters[adapter.name] = adapter

    def find(self, name: Optional[str] = None, lora_int_id: Optional[int] = None) -> Optional[Adapter]:
        """The adapter of that name and id (either may be None, not both)."""
        for adapter in self.adapters.values():
            if name in (None, adapter.name) and lora_int_id in (None, adapter.request.lora_int_id):
                return adapter
        return None

    def hold(self, request: Optional[LoRARequest]) -> Callable[[], None]:
        """Count one more user of `request`'s adapter; the returned function (idempotent) ends it."""
        if request is None:
            return lambda: None
        name = request.lora_name
        self._holders[name] = self._holders.get(name, 0) + 1
        released = []

        def release() -> None:
            if not released:
                released.append(True)
                self._holders[name] -= 1
        return release

    def holders(self, name: str) -> int:
        return self._holders.get(name, 0)


def load_adapters(engines: Mapping[str, EnginePort], modules: Sequence[LoRAModule]) -> LoRARegistry:
    """Read every checked module into its base model's engine (before the engine loops start) and register it;
    ValueError (LoRAAdapterError) naming the adapter and what is wrong with it."""
    registry = LoRARegistry()
    for module in modules:
        request = registry.new_request(module.name, os.path.abspath(module.path))
        try:
            engines[module.base_model_name].add_lora(request)
        except ValueError as error:
            raise ValueError(f"--lora-modules: adapter {module.name!r} ({module.path}): {error}") from None
        registry.add(request, module.base_model_name)
        logger.info("LoRA adapter %s (id %d) on %s: %s", module.name, request.lora_int_id, module.base_model_name,
                    request.lora_path)
    return registry
