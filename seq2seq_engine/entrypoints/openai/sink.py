"""What the engine loop sends back to a request handler: a thread-safe hand-off into the handler's asyncio queue,
and the messages it carries."""
from __future__ import annotations

import asyncio
import dataclasses
from typing import Any, Optional


@dataclasses.dataclass(frozen=True)
class Accepted:
    """The engine queued the request (or the transcription job)."""

    request_id: str


@dataclasses.dataclass(frozen=True)
class Rejected:
    """The engine refused the request: `error` is the ValueError/TypeError it raised (a 400 for the client)."""

    request_id: str
    error: BaseException


@dataclasses.dataclass(frozen=True)
class Failed:
    """The request was aborted by the server: the engine loop hit an unexpected error (500) or the server is
    shutting down (503)."""

    request_id: str
    message: str
    status: int = 500


@dataclasses.dataclass(frozen=True)
class InputResult:
    """One finished input of a transcription job."""

    index: int
    result: Any


@dataclasses.dataclass(frozen=True)
class InputProgress:
    """Segments and text of an input's windows that became final, in time order (streamed transcription jobs)."""

    index: int
    segments: Any
    text: str


@dataclasses.dataclass(frozen=True)
class JobDone:
    """A transcription job has no request left."""

    job_id: str


class Sink:
    """The handler side of a request: items put from the engine thread land in an asyncio.Queue of the event loop
    the handler runs on (loop.call_soon_threadsafe), so the loop thread never waits for the engine."""

    def __init__(self, loop: Optional[asyncio.AbstractEventLoop] = None) -> None:
        self.loop = loop or asyncio.get_running_loop()
        self.queue: asyncio.Queue = asyncio.Queue()

    def put(self, item: Any) -> None:
        """Thread-safe; dropped when the event loop has closed (the server is gone)."""
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)
        except RuntimeError:
            pass
