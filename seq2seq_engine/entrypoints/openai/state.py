"""What the handlers share: the engine loop, the metrics, the served model's facts, its LoRA adapters and the limits."""
from __future__ import annotations

import dataclasses
import math
import time
from typing import Any, Optional, Tuple

from seq2seq_engine.config import ModelConfig
from seq2seq_engine.engine_port import EnginePort
from seq2seq_engine.entrypoints.openai.engine_loop import EngineLoop
from seq2seq_engine.entrypoints.openai.errors import APIError
from seq2seq_engine.entrypoints.openai.interim_budget import InterimBudget
from seq2seq_engine.entrypoints.openai.lora_registry import LoRARegistry
from seq2seq_engine.entrypoints.openai.metrics import ServerMetrics
from seq2seq_engine.lora_request import LoRARequest


@dataclasses.dataclass(frozen=True)
class ServerSettings:
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: Optional[str] = None
    max_upload_bytes: int = 25 * 1024 * 1024  # OpenAI's own audio upload limit
    max_audio_seconds: float = 3 * 3600.0  # of decoded audio per upload (decisions §73); inf: none
    max_realtime_sessions: int = 64  # open /v1/realtime sockets, all models together
    allow_runtime_lora_updating: bool = False  # POST /v1/load_lora_adapter and /v1/unload_lora_adapter
    ui: bool = True  # the browser page at / (web_ui.py); --no-ui turns it off

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in [0, 65535], got {self.port}")
        if self.max_upload_bytes < 1:
            raise ValueError(f"max_upload_bytes must be >= 1, got {self.max_upload_bytes}")
        if math.isnan(self.max_audio_seconds) or self.max_audio_seconds <= 0:
            raise ValueError(f"max_audio_seconds must be > 0 (inf: no limit), got {self.max_audio_seconds}")
        if isinstance(self.max_realtime_sessions, bool) or not isinstance(self.max_realtime_sessions, int) or \
                self.max_realtime_sessions < 0:
            raise ValueError(f"max_realtime_sessions must be an integer >= 0, got {self.max_realtime_sessions!r}")


@dataclasses.dataclass(frozen=True)
class ServerState:
    """Read-only after start-up. The engine is reached only through `loop`; its tokenizer, configs and generation
    defaults are read here (never changed), so handlers can tokenize and render without a round trip."""

    loop: EngineLoop
    metrics: ServerMetrics
    model_name: str
    settings: ServerSettings
    created: int = dataclasses.field(default_factory=lambda: int(time.time()))
    # shared by the realtime sockets of this engine (the object changes inside, the field never)
    interim_budget: InterimBudget = dataclasses.field(default_factory=InterimBudget)

    @property
    def engine(self) -> EnginePort:
        return self.loop.engine

    @property
    def tokenizer(self) -> Any:
        return self.engine.tokenizer

    @property
    def model_config(self) -> ModelConfig:
        return self.engine.model_config

    @property
    def is_encoder_decoder(self) -> bool:
        return bool(getattr(self.engine.hf_config, "is_encoder_decoder", False))

    @property
    def takes_audio(self) -> bool:
        return self.engine.num_mel_bins is not None

    def need_tokenizer(self) -> Any:
        if self.tokenizer is None:
            raise APIError("this server runs without a tokenizer (--skip-tokenizer-init): send token ids")
        return self.tokenizer


@dataclasses.dataclass(frozen=True)
class Target:
    """What a request's `model` names: a served model, or a LoRA adapter (`lora`) on one; `name` is echoed back."""

    state: ServerState
    lora: Optional[LoRARequest] = None

    @property
    def name(self) -> str:
        return self.lora.lora_name if self.lora is not None else self.state.model_name


@dataclasses.dataclass(frozen=True)
class ServedModels:
    """Every model one server serves (one ServerState each, in command-line order), its LoRA adapters (`loras`,
    changed at run time by the runtime routes) and the server's limits; requests find their model by the name they
    send."""

    states: Tuple[ServerState, ...]
    settings: ServerSettings
    loras: LoRARegistry = dataclasses.field(default_factory=LoRARegistry)

    def __post_init__(self) -> None:
        names = [state.model_name for state in self.states]
        if not names:
            raise ValueError("a server needs at least one model")
        if len(set(names)) != len(names):
            raise ValueError(f"served model names must differ, got {names}")

    @property
    def names(self) -> Tuple[str, ...]:
        return tuple(state.model_name for state in self.states)

    @property
    def alive(self) -> bool:
        return all(state.loop.alive for state in self.states)

    def resolve(self, name: Optional[str]) -> ServerState:
        """The model a request names (an adapter's: its base model; the only one when it names none); 404
        model_not_found otherwise."""
        return self.target(name).state

    def target(self, name: Optional[str]) -> Target:
        """The model or adapter a request names (the only model when it names none); 404 model_not_found
        otherwise."""
        if name is None and len(self.states) == 1:
            return Target(self.states[0])
        if name is None:
            raise APIError(f"model is required: this server serves {list(self.names)}", param="model")
        if name in self.names:
            return Target(self.base(name))
        adapter = self.loras.adapters.get(name)
        if adapter is not None:
            return Target(self.base(adapter.base), adapter.request)
        served = repr(self.names[0]) if len(self.states) == 1 else str(list(self.names))
        if self.loras.adapters:
            served += f" and the LoRA adapters {sorted(self.loras.adapters)}"
        raise APIError(f"the model {name!r} does not exist; this server serves {served}", 404, param="model",
                       code="model_not_found")

    def base(self, name: str) -> ServerState:
        """The served model of that name (not an adapter's); KeyError otherwise."""
        for state in self.states:
            if state.model_name == name:
                return state
        raise KeyError(name)
