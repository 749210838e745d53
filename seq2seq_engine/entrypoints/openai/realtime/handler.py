"""One realtime transcription socket: owns its LiveSession (rebuilt when session.update changes it), turns client
events into session calls, submits the session's decodes to the model's engine loop (the same continuous batch as
every other request), feeds finished decodes back, and aborts what is still running when the socket closes."""
from __future__ import annotations

import asyncio
import dataclasses
import itertools
from typing import Any, Awaitable, Callable, Dict, List, Optional, Tuple

from starlette.concurrency import run_in_threadpool

from seq2seq_engine.entrypoints.openai.errors import APIError
from seq2seq_engine.entrypoints.openai.realtime.config import apply_update, session_json
from seq2seq_engine.entrypoints.openai.realtime.protocol import (ClientEvent, RealtimeError, SessionConfig,
                                                                 decode_audio, error_event, live_event_json, new_id,
                                                                 parse_event, server_event)
from seq2seq_engine.entrypoints.openai.sink import Accepted, Failed, Rejected, Sink
from seq2seq_engine.entrypoints.openai.state import ServedModels, ServerState, Target
from seq2seq_engine.errors import param_of
from seq2seq_engine.lora_request import LoRARequest
from seq2seq_engine.transcription.live import events as live
from seq2seq_engine.transcription.live.audio_buffer import AudioBacklog
from seq2seq_engine.transcription.live.pcm import Pcm16Stream

Send = Callable[[Dict[str, Any]], Awaitable[None]]
# (state, config, session id) -> a LiveSession; ValueError for a configuration the model cannot run.
SessionFactory = Callable[[ServerState, SessionConfig, str], Any]


class CloseSocket(Exception):
    """The socket must close after the error event already sent (WebSocket close `code`)."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


@dataclasses.dataclass
class _Live:
    """A LiveSession with the state (engine loop) its decodes run on, the audio stream that feeds it and the LoRA
    adapter its decodes run with (None: the base model)."""

    session: Any
    state: ServerState
    stream: Pcm16Stream
    lora: Optional[LoRARequest] = None


class RealtimeTranscription:
    """The server side of one socket. `handle` takes each client message, `pump` feeds engine outputs back until
    cancelled, `close` aborts the decodes still running. Session calls run off the event loop (VAD and features
    cost milliseconds) under one lock, so events go out in the order the session emits them."""

    def __init__(self, models: ServedModels, state: ServerState, send: Send, make_session: SessionFactory,
                 max_buffered_s: float, lora: Optional[LoRARequest] = None) -> None:
        self.models, self.send, self.make_session = models, send, make_session
        self.max_buffered_s = max_buffered_s
        self.id = new_id("sess")
        self._target = Target(state, lora)  # the model (or LoRA adapter) of the session's configuration
        self.config = SessionConfig(model=self._target.name)
        self.sink = Sink()
        self.live: Optional[_Live] = None
        self._release = models.loras.hold(lora)  # the adapter stays loaded while the socket uses it
        self._owners: Dict[str, _Live] = {}  # request id -> the session that asked for it (older ones included)
        self._lock = asyncio.Lock()
        self._progress = asyncio.Event()  # set whenever a decode of the socket finishes
        self._generation = itertools.count()

    # ---------------------------------------------------------------- client side
    async def start(self) -> None:
        session = session_json(self.config, self.id, self._target.name)
        await self.send(server_event("session.created", session=session))

    async def handle(self, message: Any) -> None:
        """One client message; a refused one gets an error event and the socket stays open (CloseSocket for
        the errors that end it)."""
        async with self._lock:
            try:
                await self._dispatch(parse_event(message))
            except RealtimeError as error:
                await self.send(error_event(error))
                if error.close_code is not None:
                    raise CloseSocket(error.close_code) from None

    async def wait_for_room(self) -> None:
        """Return once the current session is not backlogged (at once when it is not): the reader calls it before
        each client event, so a client sending audio faster than it is transcribed is held back by its socket."""
        while True:
            async with self._lock:
                self._progress.clear()
                if self.live is None or not self.live.session.backlogged:
                    return
            await self._progress.wait()

    async def _dispatch(self, event: ClientEvent) -> None:
        if event.type == "session.update":
            await self._update(event)
        elif event.type == "input_audio_buffer.append":
            await self._append(event)
        elif event.type == "input_audio_buffer.commit":
            await self._run(event, lambda live: live.session.commit())
        else:
            await self._run(event, lambda live: live.session.clear())

    async def _update(self, event: ClientEvent) -> None:
        config = apply_update(self.config, event)
        target = self._target_for(config, event)
        if self.live is None or dataclasses.replace(config, rate=0) != dataclasses.replace(self.config, rate=0):
            # A new transcription: audio not committed yet is dropped; decodes in flight still complete.
            self.live = await self._build(config, target, event.event_id)
        elif config.rate != self.config.rate:
            self.live.stream = Pcm16Stream(config.rate)
        if target.lora != self._target.lora:
            self._release()
            self._release = self.models.loras.hold(target.lora)
        self.config, self._target = config, target
        session = session_json(self.config, self.id, target.name)
        await self.send(server_event("session.updated", session=session))

    def _target_for(self, config: SessionConfig, event: ClientEvent) -> Target:
        param = "session.audio.input.transcription.model"
        try:
            target = self.models.target(config.model)
        except APIError as error:
            raise RealtimeError(error.message, error.code or "invalid_value", param, event.event_id) from None
        if not target.state.takes_audio:
            raise RealtimeError(f"the model {target.name!r} takes no audio (it is not a Whisper model)",
                                "model_not_supported", param, event.event_id, close_code=1008)
        return target

    async def _build(self, config: SessionConfig, target: Target, event_id: Optional[str]) -> _Live:
        session_id = f"{self.id}-{next(self._generation)}"
        try:
            session = await run_in_threadpool(self.make_session, target.state, config, session_id)
        except ValueError as error:
            raise RealtimeError(str(error), "invalid_value", _session_field(error), event_id) from None
        return _Live(session, target.state, Pcm16Stream(config.rate), target.lora)

    async def _live(self, event_id: Optional[str]) -> _Live:
        """The current session, built with the configuration so far when audio comes before any session.update."""
        if self.live is None:
            self.live = await self._build(self.config, self._target, event_id)
        return self.live

    async def _append(self, event: ClientEvent) -> None:
        rate = self.config.rate
        data = decode_audio(event, max_bytes=int(self.max_buffered_s * rate) * 2)
        current = await self._live(event.event_id)
        seconds = len(data) / 2 / rate
        # The session bounds what it holds (beyond max_buffered_s it commits the turn early).
        await self._run(event, lambda live: live.session.append(live.stream.decode(data)), current)
        current.state.metrics.realtime_audio(seconds)

    async def _run(self, event: ClientEvent, call: Callable[[_Live], List[Any]],
                   current: Optional[_Live] = None) -> None:
        current = current or await self._live(event.event_id)
        try:
            events, requests, stale = await run_in_threadpool(_call_and_take, current, call)
        except AudioBacklog as error:  # only a client whose events arrive while backlogged, which the reader prevents
            raise RealtimeError(str(error), "input_audio_buffer_full", "audio", event.event_id) from None
        except ValueError as error:
            raise RealtimeError(str(error), _code_of(event), None, event.event_id) from None
        self._submit(current, requests, stale)
        await self._emit(current, events)

    # ---------------------------------------------------------------- engine side
    def _submit(self, owner: _Live, requests: List[Any], stale: List[str]) -> None:
        """Abort the session's stale decodes (ones a later decode overtook), then submit its new ones."""
        stale = [request_id for request_id in stale if self._owners.pop(request_id, None)]
        if stale:
            owner.state.loop.abort(*stale)
        for request in requests:
            self._owners[request.request_id] = owner
            owner.state.loop.add_request(request.request_id, request.prompt, request.params, self.sink, owner.lora)

    async def pump(self) -> None:
        """Feed the session each finished decode, until cancelled."""
        while True:
            item = await self.sink.queue.get()
            if isinstance(item, Accepted) or not (isinstance(item, (Rejected, Failed)) or item.finished):
                continue
            async with self._lock:
                try:
                    await self._engine_item(item)
                finally:
                    self._progress.set()

    async def _engine_item(self, item: Any) -> None:
        owner = self._owners.pop(item.request_id, None)
        if owner is None:
            return
        if isinstance(item, (Rejected, Failed)):
            message = str(item.error) if isinstance(item, Rejected) else item.message
            await self.send(error_event(RealtimeError(f"a decode of this session failed: {message}",
                                                      "transcription_failed", kind="server_error")))
            if isinstance(item, Failed) and item.status == 503:
                raise CloseSocket(1012)  # the server is shutting down
            tokens: List[int] = []
        else:
            tokens = list(item.outputs[0].token_ids)
        events, requests, stale = await run_in_threadpool(
            _call_and_take, owner, lambda live: live.session.on_output(item.request_id, tokens))
        self._submit(owner, requests, stale)
        await self._emit(owner, events)

    async def _emit(self, owner: _Live, events: List[Any]) -> None:
        for event in events:
            if isinstance(event, live.Completed):
                owner.state.metrics.realtime_turn(event.audio_seconds)
            await self.send(live_event_json(event))

    def close(self) -> None:
        """Abort every decode still running (their self and cross blocks go back to the pool); the session's LoRA
        adapter may be unloaded from now on."""
        self._release()
        by_loop: Dict[int, Tuple[Any, List[str]]] = {}
        for request_id, owner in self._owners.items():
            by_loop.setdefault(id(owner.state.loop), (owner.state.loop, []))[1].append(request_id)
        for loop, request_ids in by_loop.values():
            loop.abort(*request_ids)
        self._owners.clear()


def _call_and_take(current: _Live, call: Callable[[_Live], List[Any]]) -> Tuple[List[Any], List[Any], List[str]]:
    """The session's events from `call`, the decodes to submit and the stale ones to abort."""
    events = list(call(current))
    stale = current.session.take_stale()
    # Interim and speculative decodes only while the engine runs nothing for other sockets (the session's own
    # decodes and its stale ones, about to be aborted, do not count), and interim ones within the engine's budget:
    # each one runs a whole 30 s encoder window, and with several streams they would hold up the turns' final
    # decodes (the latency clients wait for).
    own = len(stale) + len(current.session.pending_request_ids())
    idle = current.state.loop.requests_in_flight <= own
    if idle and current.session.interim_queued:
        idle = current.state.interim_budget.take()
    return events, list(current.session.take_requests(interim=idle)), stale


def _code_of(event: ClientEvent) -> str:
    return {"input_audio_buffer.commit": "input_audio_buffer_commit_empty"}.get(event.type, "invalid_value")


# The session field behind each LiveOptions / TurnDetection / Whisper language parameter a refusal can name; the
# other LiveOptions fields are the server's own settings, not the client's.
_SESSION_FIELDS = {"language": "session.audio.input.transcription.language",
                   "prompt": "session.audio.input.transcription.prompt",
                   "threshold": "session.audio.input.turn_detection.threshold",
                   "prefix_padding_ms": "session.audio.input.turn_detection.prefix_padding_ms",
                   "silence_duration_ms": "session.audio.input.turn_detection.silence_duration_ms"}


def _session_field(error: BaseException) -> Optional[str]:
    """The session field of the parameter a LiveOptions / TurnDetection / LiveDecoder error names, if any."""
    name = param_of(error)
    return None if name is None else _SESSION_FIELDS.get(name)
