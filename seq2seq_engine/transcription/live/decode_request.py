"""One decode a live transcription asks its owner to run: an engine request's id, prompt and parameters."""
from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class DecodeRequest:
    """Submit as `engine.add_request(request_id, prompt, params)`; hand its finished tokens to `on_output`."""

    request_id: str
    prompt: dict
    params: Any
