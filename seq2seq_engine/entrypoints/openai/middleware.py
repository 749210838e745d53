"""ASGI middleware of the server: the API key on every route but /health, /metrics and the browser page (401) and
the request-body size limit (413), answered with OpenAI-style error bodies."""
from __future__ import annotations

import hmac
from typing import Collection, Optional, Tuple

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from seq2seq_engine.entrypoints.openai.errors import error_response

# Probes and scrapers reach these without the key; they reveal no request content.
OPEN_PATHS = frozenset({"/health", "/metrics"})
# A browser cannot set headers on a WebSocket: it sends the key as this subprotocol (OpenAI's browser clients do).
KEY_SUBPROTOCOL = "openai-insecure-api-key."


class ApiKeyMiddleware:
    """With a key, every request but GET /health and /metrics needs `Authorization: Bearer KEY` (401 otherwise),
    unknown paths included, so a new route is guarded without being listed anywhere. `page_paths` and the paths
    under `page_prefixes` (the browser page and its files, which hold no data) are open to GET and HEAD too. A
    WebSocket may instead offer the subprotocol `openai-insecure-api-key.KEY`."""

    def __init__(self, app: ASGIApp, api_key: Optional[str], page_paths: Collection[str] = (),
                 page_prefixes: Tuple[str, ...] = ()) -> None:
        self.app, self.api_key = app, api_key
        self.page_paths, self.page_prefixes = frozenset(page_paths), tuple(page_prefixes)

    def _open(self, scope: Scope) -> bool:
        path = scope["path"]
        if path in OPEN_PATHS:
            return True
        return scope["type"] == "http" and scope.get("method") in ("GET", "HEAD") and (
            path in self.page_paths or path.startswith(self.page_prefixes))

    def _authorized(self, scope: Scope) -> bool:
        headers = dict(scope.get("headers") or [])
        given = headers.get(b"authorization", b"").decode("latin-1")
        if hmac.compare_digest(given.encode(), f"Bearer {self.api_key}".encode()):
            return True
        expected = f"{KEY_SUBPROTOCOL}{self.api_key}".encode()
        offered = (scope.get("subprotocols") or []) if scope["type"] == "websocket" else []
        return any(hmac.compare_digest(protocol.encode(), expected) for protocol in offered)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.api_key is None or scope["type"] not in ("http", "websocket") or self._open(scope):
            await self.app(scope, receive, send)
            return
        if self._authorized(scope):
            await self.app(scope, receive, send)
        elif scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
        else:
            response = error_response("missing or wrong API key: send the header 'Authorization: Bearer <key>'",
                                      401, code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
            await response(scope, receive, send)


class BodyLimitMiddleware:
    """A request body over `max_bytes` is refused with 413: at once when its Content-Length says so, else when
    the bytes received pass the limit (chunked uploads)."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._refuse(scope, receive, send)
            return
        received = 0

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:  # raised inside the handler reading the body: answered as a 413
                    raise HTTPException(413, self._message())
            return message

        await self.app(scope, limited_receive, send)

    def _message(self) -> str:
        return f"the request body is larger than the server's limit of {self.max_bytes} bytes (--max-upload-mb)"

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = error_response(self._message(), 413, code="file_too_large", headers={"Connection": "close"})
        await response(scope, receive, send)
