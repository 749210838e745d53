"""Server-sent events: `data: {json}` events ending with `data: [DONE]`, in a response that always closes its
generator (so the generator's cleanup aborts the engine requests of a client that went away)."""
from __future__ import annotations

import json
import logging
from typing import Any, AsyncIterator, Awaitable, Callable, Dict, Optional

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from seq2seq_engine.entrypoints.openai.errors import APIError, ClientGone, error_body

logger = logging.getLogger(__name__)

DONE = "[DONE]"


def sse(data: Any) -> str:
    """One server-sent event carrying `data` as JSON (or the literal [DONE])."""
    return f"data: {data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)}\n\n"


async def with_error_events(events: AsyncIterator[str]) -> AsyncIterator[str]:
    """The events, then [DONE]; an error after the response has started becomes an error event before [DONE]."""
    try:
        async for event in events:
            yield event
    except ClientGone:
        return
    except APIError as error:
        yield sse(error_body(error.message, error.status, error.param, error.code))
    except Exception as error:  # the stream has started: the status cannot change any more
        logger.exception("error while streaming a response")
        yield sse(error_body(f"internal error: {type(error).__name__}: {error}", 500))
    yield sse(DONE)


class EventStreamResponse(StreamingResponse):
    """`cleanup` runs however the response ends (sent, client gone, never started): it aborts what is unfinished."""

    def __init__(self, events: AsyncIterator[str], cleanup: Callable[[], Awaitable[None]],
                 headers: Optional[Dict[str, str]] = None) -> None:
        super().__init__(with_error_events(events), media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", **(headers or {})})
        self._events, self._cleanup = events, cleanup

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.body_iterator.aclose()  # type: ignore[union-attr]
            await self._events.aclose()  # type: ignore[attr-defined]
            await self._cleanup()
