"""One decode a live transcription asks its owner to run: an engine request's id, prompt, parameters and adapter."""
from __future__ import annotations

import dataclasses
from typing import Any, Optional


@dataclasses.dataclass(frozen=True)
class DecodeRequest:
    """Submit as `engine.add_request(request_id, prompt, params, lora_request=lora_request)`; hand its finished
    tokens to `on_output`."""

    request_id: str
    prompt: dict
    params: Any
    lora_request: Optional[Any] = None    # the LoRARequest of the session's decoder, or None
