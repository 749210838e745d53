"""OpenAI's realtime transcription events: the client's events parsed and checked (RealtimeError naming the field),
the `session` configuration they update, and the server's events as JSON-ready dicts, each with an `event_id`."""
from __future__ import annotations

import base64
import binascii
import dataclasses
import json
import math
import uuid
from typing import Any, Dict, Optional, Tuple

from seq2seq_engine.errors import over_limit
from seq2seq_engine.transcription.live import events as live

CLIENT_EVENTS = ("session.update", "input_audio_buffer.append", "input_audio_buffer.commit",
                 "input_audio_buffer.clear")
RATES = (24000, 16000)  # OpenAI's pcm16 is 24 kHz; 16 kHz (Whisper's own rate) is taken as well
MAX_NAME_CHARS = 256  # event_id, model, language: names, never long text
# The largest WebSocket message the server reads (uvicorn closes the socket with 1009 beyond it): an append event
# of a minute of 24 kHz pcm16 in base64 (3.84 MB) with room for its JSON.
MAX_MESSAGE_BYTES = 4 * 1024 * 1024


class RealtimeError(Exception):
    """A client event refused: an `error` event (type, code, message, param, event_id); the socket stays open
    unless `close_code` is set."""

    def __init__(self, message: str, code: str = "invalid_value", param: Optional[str] = None,
                 event_id: Optional[str] = None, kind: str = "invalid_request_error",
                 close_code: Optional[int] = None) -> None:
        super().__init__(message)
        self.message, self.code, self.param, self.event_id, self.kind = message, code, param, event_id, kind
        self.close_code = close_code  # set: the socket closes with this code after the error event


@dataclasses.dataclass(frozen=True)
class TurnSettings:
    threshold: float = 0.5
    prefix_padding_ms: int = 300
    silence_duration_ms: int = 500


@dataclasses.dataclass(frozen=True)
class SessionConfig:
    """What a transcription session is set to; `model` None: the server's audio model."""

    rate: int = 24000
    model: Optional[str] = None
    language: Optional[str] = None
    prompt: Optional[str] = None
    turn_detection: Optional[TurnSettings] = TurnSettings()


@dataclasses.dataclass(frozen=True)
class ClientEvent:
    type: str
    event_id: Optional[str]
    body: Dict[str, Any]


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:20]}"


def parse_event(text: Any) -> ClientEvent:
    """A client event from one WebSocket message: a JSON object whose `type` is one this server takes."""
    if not isinstance(text, str):
        raise RealtimeError("events are JSON text messages, not binary ones", "invalid_json")
    try:
        body = json.loads(text)
    except ValueError as error:
        raise RealtimeError(f"the event is not valid JSON: {error}", "invalid_json") from None
    if not isinstance(body, dict):
        raise RealtimeError("an event must be a JSON object", "invalid_json")
    event_id = body.get("event_id") if isinstance(body.get("event_id"), str) else None
    if event_id is not None and len(event_id) > MAX_NAME_CHARS:
        raise RealtimeError(f"event_id has {len(event_id)} characters, more than the limit of {MAX_NAME_CHARS}",
                            "string_above_max_length", "event_id")
    kind = body.get("type")
    if not isinstance(kind, str):
        raise RealtimeError("the event has no `type`", "missing_required_parameter", "type", event_id)
    if kind not in CLIENT_EVENTS:
        raise RealtimeError(f"unknown or unsupported event type {kind!r} for a transcription session; this server "
                            f"takes {list(CLIENT_EVENTS)}", "invalid_event_type", "type", event_id)
    return ClientEvent(kind, event_id, body)


def decode_audio(event: ClientEvent, max_bytes: int) -> bytes:
    """The pcm16 bytes of an input_audio_buffer.append event (base64 in `audio`)."""
    audio = event.body.get("audio")
    if not isinstance(audio, str):
        raise RealtimeError("input_audio_buffer.append needs `audio`: base64 of pcm16 little-endian mono",
                            "missing_required_parameter", "audio", event.event_id)
    if len(audio) > max_bytes * 4 // 3 + 4:
        raise RealtimeError(f"an append event carries at most {max_bytes} bytes of audio", "invalid_value",
                            "audio", event.event_id)
    try:
        data = base64.b64decode(audio, validate=True)
    except (binascii.Error, ValueError) as error:
        raise RealtimeError(f"`audio` is not valid base64: {error}", "invalid_base64", "audio",
                            event.event_id) from None
    if len(data) % 2:
        raise RealtimeError(f"`audio` holds {len(data)} bytes: pcm16 samples take 2 bytes each", "invalid_audio",
                            "audio", event.event_id)
    return data


def invalid(param: str, expected: str, got: Any, event_id: Optional[str]) -> RealtimeError:
    return RealtimeError(f"{param} must be {expected}, got {got!r}", "invalid_value", param, event_id)


def check_object(value: Any, param: str, event_id: Optional[str], keys: Optional[set] = None) -> Dict[str, Any]:
    if not isinstance(value, dict):
        raise invalid(param, "an object", value, event_id)
    unknown = sorted(set(value) - keys) if keys is not None else []
    if unknown:
        raise RealtimeError(f"unknown parameter {param}.{unknown[0]}", "unknown_parameter",
                            f"{param}.{unknown[0]}", event_id)
    return value


def check_number(value: Any, param: str, low: float, high: float, event_id: Optional[str], integer: bool) -> Any:
    kind = int if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kind) or not low <= value <= high or (
            isinstance(value, float) and math.isnan(value)):
        what = "an integer" if integer else "a number"
        raise invalid(param, f"{what} in [{low:g}, {high:g}]", value, event_id)
    return value


def check_text(value: Any, param: str, event_id: Optional[str], max_chars: int = MAX_NAME_CHARS) -> Optional[str]:
    if value is not None and not isinstance(value, str):
        raise invalid(param, "a string or null", value, event_id)
    refusal = None if value is None else over_limit(param, len(value), max_chars, "characters")
    if refusal is not None:
        raise RealtimeError(refusal[0], refusal[1], param, event_id)
    return value or None


def check_unset(body: Dict[str, Any], names: Tuple[str, ...], param: str, event_id: Optional[str]) -> None:
    for name in names:
        if body.get(name) not in (None, [], False):
            raise RealtimeError(f"{param}.{name} is not supported by this server", "unsupported_parameter",
                                f"{param}.{name}", event_id)


def server_event(kind: str, **fields: Any) -> Dict[str, Any]:
    return {"event_id": new_id("event"), "type": kind, **fields}


def error_event(error: RealtimeError) -> Dict[str, Any]:
    return server_event("error", error={"type": error.kind, "code": error.code, "message": error.message,
                                        "param": error.param, "event_id": error.event_id})


def live_event_json(event: Any) -> Dict[str, Any]:
    """The server event of one live transcription event (seq2seq_engine.transcription.live.events)."""
    if isinstance(event, live.SpeechStarted):
        return server_event("input_audio_buffer.speech_started", item_id=event.item_id,
                            audio_start_ms=event.audio_start_ms)
    if isinstance(event, live.SpeechStopped):
        return server_event("input_audio_buffer.speech_stopped", item_id=event.item_id,
                            audio_end_ms=event.audio_end_ms)
    if isinstance(event, live.Committed):
        return server_event("input_audio_buffer.committed", item_id=event.item_id,
                            previous_item_id=event.previous_item_id)
    if isinstance(event, live.Cleared):
        return server_event("input_audio_buffer.cleared")
    if isinstance(event, live.Delta):
        return server_event("conversation.item.input_audio_transcription.delta", item_id=event.item_id,
                            content_index=0, delta=event.text)
    if isinstance(event, live.Completed):
        return server_event("conversation.item.input_audio_transcription.completed", item_id=event.item_id,
                            content_index=0, transcript=event.transcript,
                            usage={"type": "duration", "seconds": round(event.audio_seconds, 3)})
    raise TypeError(f"not a live transcription event: {event!r}")
