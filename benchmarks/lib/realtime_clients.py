"""The live clients of realtime_load.py: N WebSocket transcription sessions on /v1/realtime, each sending its
stream's pcm16 in chunks at a fixed pace, all starting at once, every server event timed on arrival."""
from __future__ import annotations

import asyncio
import base64
import json
import time
from typing import Any, Dict, List, Optional

from benchmarks.lib.long_audio import Recording
from benchmarks.lib.realtime_streams import chunks_of, pcm16

COMPLETED = "conversation.item.input_audio_transcription.completed"
DELTA = "conversation.item.input_audio_transcription.delta"


def session_update(model: str, detection: Dict[str, Any]) -> Dict[str, Any]:
    """16 kHz pcm16 (the samples both engines read, no resampling), English, server VAD with `detection`."""
    return {"type": "session.update", "session": {"type": "transcription", "audio": {"input": {
        "format": {"type": "audio/pcm", "rate": 16000}, "transcription": {"model": model, "language": "en"},
        "turn_detection": {"type": "server_vad", **detection}}}}}


async def _open(url: str, update: Dict[str, Any]) -> Any:
    from websockets.asyncio.client import connect
    ws = await connect(f"{url.replace('http://', 'ws://')}/v1/realtime?intent=transcription", max_size=None,
                       open_timeout=60)
    created = json.loads(await ws.recv())
    if created["type"] != "session.created":
        raise RuntimeError(f"expected session.created, got {created}")
    await ws.send(json.dumps(update))
    while True:
        event = json.loads(await ws.recv())
        if event["type"] == "session.updated":
            return ws
        if event["type"] == "error":
            raise RuntimeError(f"session.update refused: {event['error']}")


async def _receive(ws: Any, t0: float, events: List[tuple]) -> None:
    async for message in ws:
        events.append((time.perf_counter() - t0, json.loads(message)))


def _all_done(events: List[tuple]) -> bool:
    started = {e["item_id"] for _, e in events if e["type"] == "input_audio_buffer.speech_started"}
    done = {e["item_id"] for _, e in events if e["type"] == COMPLETED}
    return started <= done


async def _stream(ws: Any, recording: Recording, chunk_s: float, pace: float, t0: float, settle: float,
                  timeout: float) -> List[tuple]:
    """Send chunk k once it has been 'recorded' (at t0 + (k + 1) * chunk_s / pace); then wait until every item the
    server started has its transcript and nothing came for `settle` seconds (or `timeout` passed)."""
    events: List[tuple] = []
    receiver = asyncio.create_task(_receive(ws, t0, events))
    try:
        for k, piece in enumerate(chunks_of(recording.samples, chunk_s)):
            delay = t0 + (k + 1) * chunk_s / pace - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            audio = base64.b64encode(pcm16(piece)).decode()
            await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": audio}))
        deadline = time.perf_counter() + timeout
        while time.perf_counter() < deadline:
            quiet = time.perf_counter() - t0 - (events[-1][0] if events else 0.0)
            if _all_done(events) and quiet >= settle:
                break
            await asyncio.sleep(0.05)
    finally:
        receiver.cancel()
        await ws.close()
    return events


def items_of(events: List[tuple]) -> tuple:
    """The stream's VAD items as score_stream takes them (start/end in stream seconds from speech_started's
    audio_start_ms and speech_stopped's audio_end_ms; first = first delta or transcript; done = transcript), and
    the error events."""
    items: Dict[str, Dict[str, Any]] = {}
    errors = []
    for at, event in events:
        kind, item_id = event["type"], event.get("item_id")
        if kind == "error":
            errors.append(event["error"])
        elif kind == "input_audio_buffer.speech_started":
            items[item_id] = {"start": event["audio_start_ms"] / 1000, "end": float("inf"), "first": None,
                              "done": None, "text": ""}
        elif item_id in items and kind == "input_audio_buffer.speech_stopped":
            items[item_id]["end"] = event["audio_end_ms"] / 1000
        elif item_id in items and kind in (DELTA, COMPLETED):
            item = items[item_id]
            item["first"] = at if item["first"] is None else item["first"]
            if kind == COMPLETED:
                item["done"], item["text"] = at, event["transcript"]
    return list(items.values()), errors


async def run_streams(url: str, model: str, recordings: List[Recording], chunk_s: float, pace: float,
                      detection: Dict[str, Any], settle: float = 1.0, timeout: float = 120.0) -> List[List[tuple]]:
    """One session per recording, all connected first, then streamed together from one common start; the timed
    events of each."""
    update = session_update(model, detection)
    sockets = await asyncio.gather(*(_open(url, update) for _ in recordings))
    t0 = time.perf_counter() + 0.2
    return list(await asyncio.gather(*(_stream(ws, rec, chunk_s, pace, t0, settle, timeout)
                                       for ws, rec in zip(sockets, recordings))))


def run_ours(url: str, model: str, recordings: List[Recording], chunk_s: float, pace: float,
             detection: Dict[str, Any], timeout: Optional[float] = None) -> List[List[tuple]]:
    return asyncio.run(run_streams(url, model, recordings, chunk_s, pace, detection,
                                   timeout=timeout if timeout is not None else 120.0))
