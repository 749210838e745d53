"""Helpers of the realtime tests: real speech as pcm16 bytes at 16 or 24 kHz, a plain `websockets` client of
/v1/realtime, and reading server events until one of a type arrives."""
from __future__ import annotations

import base64
import json
import os
import re
from typing import Any, Dict, List, Optional

import httpx
import numpy as np
from conftest import require_speech_clips

from seq2seq_engine.audio import load_audio, resample

API_KEY = "test-key"


def clip_path(name: str) -> str:
    return os.path.join(require_speech_clips(), "en", f"{name}.wav")


def speech(name: str) -> np.ndarray:
    """The clip's float32 16 kHz samples."""
    return load_audio(clip_path(name))


def pause(seconds: float, seed: int) -> np.ndarray:
    """Quiet room noise (never digital silence) of `seconds` at 16 kHz."""
    return (np.random.default_rng(seed).standard_normal(int(seconds * 16000)) * 1e-4).astype(np.float32)


def pcm16(samples: np.ndarray, rate: int = 16000) -> bytes:
    """float32 16 kHz samples as pcm16 little-endian bytes at `rate`."""
    if rate != 16000:
        samples = resample(samples, 16000, rate)
    return (np.clip(samples, -1.0, 1.0) * 32767).round().astype("<i2").tobytes()


def chunks(data: bytes, rate: int, seconds: float = 0.1) -> List[str]:
    """The bytes in base64 pieces of `seconds` each (the append events' `audio`)."""
    size = int(rate * seconds) * 2
    return [base64.b64encode(data[at:at + size]).decode() for at in range(0, len(data), size)]


def ws_url(server: Any, query: str = "intent=transcription") -> str:
    return f"{server.url.replace('http://', 'ws://')}/v1/realtime?{query}"


def connect(server: Any, query: str = "intent=transcription", key: Optional[str] = API_KEY) -> Any:
    from websockets.sync.client import connect as ws_connect

    headers = {"Authorization": f"Bearer {key}"} if key is not None else {}
    return ws_connect(ws_url(server, query), additional_headers=headers, open_timeout=30, max_size=None)


def send(ws: Any, event: Dict[str, Any]) -> None:
    ws.send(json.dumps(event))


def recv(ws: Any, timeout: float = 60) -> Dict[str, Any]:
    return json.loads(ws.recv(timeout=timeout))


def recv_until(ws: Any, kind: str, timeout: float = 120) -> List[Dict[str, Any]]:
    """Every event up to and including the first of type `kind`."""
    events = [recv(ws, timeout)]
    while events[-1]["type"] != kind:
        events.append(recv(ws, timeout))
    return events


def transcription_update(rate: int = 16000, turn_detection: Any = "server_vad", **transcription: Any) -> dict:
    detection = {"type": "server_vad"} if turn_detection == "server_vad" else turn_detection
    return {"type": "session.update", "session": {"type": "transcription", "audio": {"input": {
        "format": {"type": "audio/pcm", "rate": rate}, "transcription": transcription,
        "turn_detection": detection}}}}


def metric(server: Any, name: str, model: str) -> float:
    """One series of the server's /metrics."""
    text = httpx.get(f"{server.url}/metrics").text
    found = re.search(rf'^seq2seq_engine:{name}{{model_name="{model}"}} (\S+)$', text, re.M)
    assert found, f"no metric {name} for {model}"
    return float(found.group(1))
