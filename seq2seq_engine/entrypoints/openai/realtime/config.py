"""A transcription session's configuration: `session.update` applied field by field (what it omits keeps its value,
OpenAI's rule), and the `session` object that session.created / session.updated carry."""
from __future__ import annotations

import dataclasses
from typing import Any, Dict, Optional

from seq2seq_engine.entrypoints.openai.realtime.protocol import (RATES, ClientEvent, RealtimeError, SessionConfig,
                                                                 TurnSettings, check_number, check_object, check_text,
                                                                 check_unset, invalid)
from seq2seq_engine.transcription.live.options import MAX_PROMPT_CHARS

_INPUT = "session.audio.input"
_TURN_KEYS = {"type", "threshold", "prefix_padding_ms", "silence_duration_ms", "create_response",
              "interrupt_response", "idle_timeout_ms"}
_TRANSCRIPTION_KEYS = {"model", "language", "prompt", "delay", "keywords", "languages"}


def apply_update(config: SessionConfig, event: ClientEvent) -> SessionConfig:
    """The configuration after a session.update event; RealtimeError naming the first bad field."""
    eid = event.event_id
    if "session" not in event.body:
        raise RealtimeError("session.update needs `session`", "missing_required_parameter", "session", eid)
    session = check_object(event.body["session"], "session", eid, {"type", "audio", "include", "id", "object"})
    if session.get("type", "transcription") != "transcription":
        raise invalid("session.type", "'transcription' (this server runs transcription sessions only)",
                      session.get("type"), eid)
    check_unset(session, ("include",), "session", eid)
    audio = check_object(session.get("audio") or {}, "session.audio", eid, {"input"})
    source = check_object(audio.get("input") or {}, _INPUT, eid,
                          {"format", "transcription", "turn_detection", "noise_reduction"})
    check_unset(source, ("noise_reduction",), _INPUT, eid)
    changes: Dict[str, Any] = {}
    if source.get("format") is not None:
        changes["rate"] = _rate(source["format"], eid)
    if source.get("transcription") is not None:
        changes.update(_transcription(source["transcription"], eid))
    if "turn_detection" in source:
        changes["turn_detection"] = _turn_detection(source["turn_detection"], config.turn_detection, eid)
    return dataclasses.replace(config, **changes)


def _rate(value: Any, eid: Optional[str]) -> int:
    fmt = check_object(value, f"{_INPUT}.format", eid, {"type", "rate"})
    if fmt.get("type", "audio/pcm") != "audio/pcm":
        raise invalid(f"{_INPUT}.format.type", "'audio/pcm' (pcm16 little-endian mono)", fmt.get("type"), eid)
    rate = fmt.get("rate", RATES[0])
    if isinstance(rate, bool) or rate not in RATES:
        raise invalid(f"{_INPUT}.format.rate", f"one of {list(RATES)}", rate, eid)
    return int(rate)


def _transcription(value: Any, eid: Optional[str]) -> Dict[str, Any]:
    param = f"{_INPUT}.transcription"
    body = check_object(value, param, eid, _TRANSCRIPTION_KEYS)
    check_unset(body, ("delay", "keywords", "languages"), param, eid)
    changes = {name: check_text(body[name], f"{param}.{name}", eid) for name in ("model", "language") if name in body}
    if "prompt" in body:
        changes["prompt"] = check_text(body["prompt"], f"{param}.prompt", eid, MAX_PROMPT_CHARS)
    return changes


def _turn_detection(value: Any, current: Optional[TurnSettings], eid: Optional[str]) -> Optional[TurnSettings]:
    param = f"{_INPUT}.turn_detection"
    if value is None:
        return None
    body = check_object(value, param, eid, _TURN_KEYS)
    if body.get("type") != "server_vad":
        raise invalid(f"{param}.type", "'server_vad' (or turn_detection null: the client commits)",
                      body.get("type"), eid)
    check_unset(body, ("idle_timeout_ms",), param, eid)
    turn = current or TurnSettings()
    changes: Dict[str, Any] = {}
    if body.get("threshold") is not None:
        changes["threshold"] = float(check_number(body["threshold"], f"{param}.threshold", 0.0, 1.0, eid, False))
    for name, high in (("prefix_padding_ms", 10_000), ("silence_duration_ms", 10_000)):
        if body.get(name) is not None:
            changes[name] = check_number(body[name], f"{param}.{name}", 0, high, eid, True)
    return dataclasses.replace(turn, **changes)


def session_json(config: SessionConfig, session_id: str, model: str) -> Dict[str, Any]:
    """The `session` object of session.created and session.updated (OpenAI's transcription session shape)."""
    turn = config.turn_detection
    detection = None if turn is None else {"type": "server_vad", **dataclasses.asdict(turn)}
    return {"type": "transcription", "id": session_id, "object": "realtime.transcription_session",
            "audio": {"input": {"format": {"type": "audio/pcm", "rate": config.rate},
                                "transcription": {"model": model, "language": config.language,
                                                  "prompt": config.prompt},
                                "turn_detection": detection, "noise_reduction": None}},
            "include": None}
