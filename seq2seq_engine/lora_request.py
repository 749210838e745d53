"""The LoRA adapter a request names (vLLM's LoRARequest) and the engine's adapter limits (LoRAConfig)."""
from __future__ import annotations

import dataclasses
from typing import Any, Optional

# The ranks a LoRA slot can hold (vLLM's supported max_lora_rank values).
SUPPORTED_RANKS = (8, 16, 32, 64, 128, 256)


@dataclasses.dataclass(frozen=True)
class LoRARequest:
    """A PEFT adapter directory (`lora_path`: adapter_config.json + adapter_model.safetensors) served under
    `lora_name`; `lora_int_id` (> 0) is the id the engine's caches and slots know it by: one id, one adapter."""

    lora_name: str
    lora_int_id: int
    lora_path: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.lora_name, str) or not self.lora_name:
            raise ValueError(f"lora_name must be a non-empty str, got {self.lora_name!r}")
        if isinstance(self.lora_int_id, bool) or not isinstance(self.lora_int_id, int) or self.lora_int_id < 1:
            raise ValueError(f"lora_int_id must be an int >= 1, got {self.lora_int_id!r}")
        if not isinstance(self.lora_path, str) or not self.lora_path:
            raise ValueError(f"lora_path of adapter {self.lora_name!r} must be a directory path, got "
                             f"{self.lora_path!r}")

    @property
    def adapter_id(self) -> int:
        return self.lora_int_id


def as_lora_request(value: Any, field: str = "lora_request") -> Optional[LoRARequest]:
    """`value` as a LoRARequest (None stays None); a TypeError names the field otherwise."""
    if value is None or isinstance(value, LoRARequest):
        return value
    raise TypeError(f"{field} must be a LoRARequest or None, got {type(value).__name__}")


@dataclasses.dataclass(frozen=True)
class LoRAConfig:
    """How many adapters one step may mix (`max_loras`, the device slots), the highest rank a slot holds
    (`max_lora_rank`) and how many loaded adapters stay in host memory (`max_cpu_loras`, at least max_loras)."""

    max_loras: int = 1
    max_lora_rank: int = 16
    max_cpu_loras: Optional[int] = None

    def __post_init__(self) -> None:
        if isinstance(self.max_loras, bool) or not isinstance(self.max_loras, int) or self.max_loras < 1:
            raise ValueError(f"max_loras must be an int >= 1, got {self.max_loras!r}")
        if self.max_lora_rank not in SUPPORTED_RANKS:
            raise ValueError(f"max_lora_rank must be one of {SUPPORTED_RANKS}, got {self.max_lora_rank!r}")
        if self.max_cpu_loras is None:
            object.__setattr__(self, "max_cpu_loras", self.max_loras)
        if not isinstance(self.max_cpu_loras, int) or self.max_cpu_loras < self.max_loras:
            raise ValueError(f"max_cpu_loras ({self.max_cpu_loras!r}) must be an int >= max_loras "
                             f"({self.max_loras})")
