"""WebSocket /v1/realtime?intent=transcription: OpenAI's realtime transcription sessions. The route admits a socket
(intent, the session limit, a model that takes audio), then runs its RealtimeTranscription: one task reads client
events (pausing while the session is backlogged), one feeds finished decodes back; when either ends the socket's
decodes are aborted."""
from __future__ import annotations

import asyncio
import json
import logging
from typing import Any, Dict, Optional

from fastapi import FastAPI, WebSocket
from starlette.websockets import WebSocketDisconnect

from seq2seq_engine.entrypoints.openai.errors import APIError
from seq2seq_engine.entrypoints.openai.realtime.handler import CloseSocket, RealtimeTranscription, SessionFactory
from seq2seq_engine.entrypoints.openai.realtime.protocol import RealtimeError, error_event
from seq2seq_engine.entrypoints.openai.realtime.sessions import LiveSessions
from seq2seq_engine.entrypoints.openai.state import ServedModels, Target

logger = logging.getLogger(__name__)

POLICY, TRY_AGAIN_LATER, INTERNAL = 1008, 1013, 1011  # WebSocket close codes (RFC 6455 §7.4.1)
# The subprotocol answered to clients that offer it (OpenAI's browser clients offer it beside the key's,
# middleware.KEY_SUBPROTOCOL; a browser drops a socket whose answer names none of the offered ones).
SUBPROTOCOL = "realtime"


class _Admission:
    """Open sockets of the server, all models together, against --max-realtime-sessions."""

    def __init__(self, limit: int) -> None:
        self.limit, self.open = limit, 0


def add_realtime_route(app: FastAPI, models: ServedModels, make_session: Optional[SessionFactory] = None,
                       max_buffered_s: Optional[float] = None) -> None:
    """Serve /v1/realtime; `make_session` builds each LiveSession (default: LiveSessions over the engine)."""
    factory = make_session if make_session is not None else LiveSessions()
    buffered = max_buffered_s if max_buffered_s is not None else LiveSessions.max_buffered_s()
    admission = _Admission(models.settings.max_realtime_sessions)

    @app.websocket("/v1/realtime")
    async def realtime(socket: WebSocket) -> None:
        await socket.accept(SUBPROTOCOL if SUBPROTOCOL in socket.scope.get("subprotocols", ()) else None)
        target = await _admit(socket, models, admission)
        if target is None:
            return
        admission.open += 1
        target.state.metrics.realtime_opened()
        try:
            await _serve(socket, RealtimeTranscription(models, target.state, _sender(socket), factory, buffered,
                                                       target.lora))
        finally:
            admission.open -= 1
            target.state.metrics.realtime_closed()


def _sender(socket: WebSocket):
    async def send(event: Dict[str, Any]) -> None:
        await socket.send_text(json.dumps(event))
    return send


async def _refuse(socket: WebSocket, error: RealtimeError, code: int) -> None:
    await socket.send_text(json.dumps(error_event(error)))
    await socket.close(code)


async def _admit(socket: WebSocket, models: ServedModels, admission: _Admission) -> Optional[Target]:
    """The model (or LoRA adapter) a new socket transcribes with, or None once it was refused (an error event, then
    close)."""
    intent = socket.query_params.get("intent")
    if intent != "transcription":
        await _refuse(socket, RealtimeError(f"this server runs transcription sessions only: connect to "
                                            f"/v1/realtime?intent=transcription (got intent={intent!r})",
                                            "invalid_intent", "intent"), POLICY)
        return None
    if admission.open >= admission.limit:
        await _refuse(socket, RealtimeError(f"the server already runs its limit of {admission.limit} realtime "
                                            "sessions (--max-realtime-sessions); try again later",
                                            "session_limit_reached", kind="server_error"), TRY_AGAIN_LATER)
        return None
    name = socket.query_params.get("model")
    audio = [state for state in models.states if state.takes_audio]
    try:
        target = models.target(name) if name is not None else Target(audio[0] if audio else models.states[0])
    except APIError as error:
        await _refuse(socket, RealtimeError(error.message, error.code or "invalid_value", "model"), POLICY)
        return None
    if not target.state.takes_audio:
        await _refuse(socket, RealtimeError(f"the model {target.name!r} takes no audio (it is not a Whisper "
                                            "model)", "model_not_supported", "model"), POLICY)
        return None
    return target


async def _serve(socket: WebSocket, handler: RealtimeTranscription) -> None:
    reader = asyncio.ensure_future(_read(socket, handler))
    pump = asyncio.ensure_future(handler.pump())
    try:
        await handler.start()
        done, _ = await asyncio.wait({reader, pump}, return_when=asyncio.FIRST_COMPLETED)
        error = next(iter(done)).exception()
    except Exception as raised:  # the client left while session.created went out
        error = raised
    finally:
        for task in (reader, pump):
            task.cancel()
        await asyncio.gather(reader, pump, return_exceptions=True)
        handler.close()
    await _finish(socket, error)


async def _read(socket: WebSocket, handler: RealtimeTranscription) -> None:
    """Client events in order; none is read while the session is backlogged, so audio sent faster than it is
    transcribed waits in the client's socket (TCP back-pressure) instead of in the server's memory."""
    while True:
        await handler.wait_for_room()
        message = await socket.receive()
        if message["type"] == "websocket.disconnect":
            return
        text = message.get("text")
        await handler.handle(text if text is not None else message.get("bytes"))


async def _finish(socket: WebSocket, error: Optional[BaseException]) -> None:
    """Close the socket as the session ended: the code CloseSocket asks for, 1011 after an unexpected error."""
    if error is None or isinstance(error, (WebSocketDisconnect, ConnectionError)):
        return
    code = error.code if isinstance(error, CloseSocket) else INTERNAL
    if not isinstance(error, CloseSocket):
        logger.error("realtime transcription session failed", exc_info=error)
    try:
        if code == INTERNAL:
            await socket.send_text(json.dumps(error_event(RealtimeError(
                f"internal error: {type(error).__name__}: {error}", "internal_error", kind="server_error"))))
        await socket.close(code)
    except Exception:  # already closed by the client
        pass
