"""The handler side of the engine loop: submit a request's prompts (or a transcription job), wait for the engine to
accept them, then read their outputs; a client that goes away aborts them."""
from __future__ import annotations

import asyncio
import dataclasses
import itertools
import time
import uuid
from typing import Any, AsyncIterator, Dict, List, Mapping, Optional, Sequence, Tuple

from starlette.requests import Request

from seq2seq_engine.beam_search_params import BeamSearchParams
from seq2seq_engine.entrypoints.openai.engine_loop import EngineLoop
from seq2seq_engine.entrypoints.openai.errors import APIError, ClientGone
from seq2seq_engine.entrypoints.openai.sink import Accepted, Failed, InputProgress, InputResult, JobDone, Rejected, Sink
from seq2seq_engine.errors import param_of
from seq2seq_engine.sampling_params import SamplingParams

_DISCONNECT_POLL_S = 0.5


class EngineRequests:
    """The engine requests of one HTTP request: one per prompt, all feeding one Sink. Use `async with` so that
    whatever is unfinished when the handler leaves (error, disconnect, cancellation) is aborted."""

    def __init__(self, loop: EngineLoop, http_request: Optional[Request], base_id: str) -> None:
        self.loop, self.connection = loop, Connection(http_request)
        self.base_id = f"{base_id}-{uuid.uuid4().hex[:8]}"
        self.sink = Sink()
        self.unfinished: List[str] = []
        self._early: List[Any] = []  # outputs that arrived while submit() waited for the engine's answers
        self._ids = itertools.count()
        self._fields: Dict[str, str] = {}

    async def __aenter__(self) -> "EngineRequests":
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        if self.unfinished:
            self.loop.abort(*self.unfinished)
            self.unfinished = []

    async def submit(self, prompts: Sequence[Any], params: Sequence[Any], param: str = "prompt",
                     fields: Optional[Mapping[str, str]] = None, lora_request: Any = None) -> List[str]:
        """Queue every prompt (with the LoRA adapter `lora_request`, if any); when the engine refuses one, abort the
        others and raise a 400 naming the parameter the refusal names (its request field by `fields`, {engine
        name: field}), else `param` (any error, a disconnect included, aborts what was queued)."""
        self._fields = dict(fields or {})
        request_ids = [f"{self.base_id}-{next(self._ids)}" for _ in prompts]
        for request_id, prompt, request_params in zip(request_ids, prompts, params):
            self.loop.add_request(request_id, prompt, request_params, self.sink, lora_request)
        self.unfinished = list(request_ids)
        try:
            await self._answers(len(request_ids), param)
        except BaseException:
            await self.__aexit__(None, None, None)
            raise
        return request_ids

    async def _answers(self, count: int, param: str) -> None:
        refusal: Optional[Rejected] = None
        answered = 0
        while answered < count:
            reply = await next_item(self.sink, self.connection)
            if not isinstance(reply, (Accepted, Rejected, Failed)):
                self._early.append(reply)
                continue
            answered += 1
            if isinstance(reply, Rejected):
                self.unfinished.remove(reply.request_id)
                refusal = refusal or reply
            elif isinstance(reply, Failed):
                raise APIError(reply.message, reply.status)
        if refusal is not None:
            raise APIError(str(refusal.error), 400, param=_param_of(refusal.error, param, self._fields))

    async def outputs(self) -> AsyncIterator[Any]:
        """Every RequestOutput of the submitted requests, as they come, until all have finished."""
        while self.unfinished:
            item = await self._next()
            if isinstance(item, Failed):
                raise APIError(item.message, item.status)
            if item.finished and item.request_id in self.unfinished:
                self.unfinished.remove(item.request_id)
            yield item

    async def final_outputs(self) -> Dict[str, Any]:
        finals = {}
        async for output in self.outputs():
            if output.finished:
                finals[output.request_id] = output
        return finals

    async def _next(self) -> Any:
        if self._early:
            return self._early.pop(0)
        return await next_item(self.sink, self.connection)


class Connection:
    """The HTTP client's connection, checked at most every _DISCONNECT_POLL_S (a cheap non-blocking receive)."""

    def __init__(self, http_request: Optional[Request]) -> None:
        self.http_request = http_request
        self._checked = time.monotonic()

    async def check(self) -> None:
        """ClientGone when the client has disconnected."""
        if self.http_request is None or time.monotonic() - self._checked < _DISCONNECT_POLL_S:
            return
        self._checked = time.monotonic()
        if await self.http_request.is_disconnected():
            raise ClientGone()


async def next_item(sink: Sink, connection: Connection) -> Any:
    """The next item from the engine; checks the client's connection while waiting and between items."""
    while True:
        await connection.check()
        try:
            return await asyncio.wait_for(sink.queue.get(), _DISCONNECT_POLL_S)
        except asyncio.TimeoutError:
            continue


async def job_messages(loop: EngineLoop, job: Any, http_request: Optional[Request]) -> AsyncIterator[Any]:
    """Run a transcription job on the engine loop: its InputProgress and InputResult messages as they come; the
    job is aborted if the caller stops early or the client goes away."""
    job_id = f"transcription-{uuid.uuid4().hex[:12]}"
    sink, connection = Sink(), Connection(http_request)
    loop.add_job(job_id, job, sink)
    try:
        while True:
            item = await next_item(sink, connection)
            if isinstance(item, (InputProgress, InputResult)):
                yield item
            elif isinstance(item, Failed):
                raise APIError(item.message, item.status)
            elif isinstance(item, JobDone):
                return
            elif not isinstance(item, Accepted):
                raise APIError(f"unexpected message from the engine loop: {item!r}", 500)
    finally:
        loop.abort(job_id)  # a no-op for a finished job


async def run_job(loop: EngineLoop, job: Any, http_request: Optional[Request]) -> List[Tuple[int, Any]]:
    """Run a transcription job on the engine loop; (input index, TranscriptionResult) in input order."""
    messages = job_messages(loop, job, http_request)
    try:
        results = [(item.index, item.result) async for item in messages if isinstance(item, InputResult)]
    finally:
        await messages.aclose()
    return sorted(results, key=lambda pair: pair[0])


# The engine parameters a request field can set (the names a refusal's ParameterError carries); the others (internal
# fields) and the errors about no parameter (the prompt's) name the request's default field.
_PARAMETERS = frozenset(field.name for params in (SamplingParams, BeamSearchParams)
                        for field in dataclasses.fields(params) if not field.name.startswith("_"))


def _param_of(error: BaseException, default: str, fields: Mapping[str, str]) -> str:
    """The request field behind the parameter an engine error names (by `fields`, else the same name; the LoRA
    adapter's: `model`, which named it); else `default`."""
    name = param_of(error)
    if name == "lora_request":
        return "model"
    if name is None or name not in _PARAMETERS:
        return default
    return fields.get(name, name)
