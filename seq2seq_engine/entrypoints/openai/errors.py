"""OpenAI-style errors: every refused request gets a 4xx with {"error": {"message", "type", "param", "code"}}."""
from __future__ import annotations

import logging
from typing import Any, Iterable, Optional

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from seq2seq_engine.errors import over_limit

logger = logging.getLogger(__name__)

_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
          405: "invalid_request_error", 413: "invalid_request_error", 422: "invalid_request_error",
          500: "internal_server_error", 503: "service_unavailable"}


class ClientGone(Exception):
    """The HTTP client disconnected while its request was running."""


class APIError(Exception):
    """A refused request: its HTTP status and the fields of the OpenAI error body."""

    def __init__(self, message: str, status: int = 400, param: Optional[str] = None,
                 code: Optional[str] = None) -> None:
        super().__init__(message)
        self.message, self.status, self.param, self.code = message, status, param, code


def check_size(param: str, size: int, limit: int, unit: str, subject: Optional[str] = None) -> None:
    """A 400 naming `param` and `limit` when `size` (a count of `unit`: "characters", "entries", ...) is over it
    (`subject`: what the message calls it, `param` by default); the code is OpenAI's for an over-long string or
    array."""
    refusal = over_limit(subject or param, size, limit, unit)
    if refusal is not None:
        raise APIError(refusal[0], param=param, code=refusal[1])


def error_body(message: str, status: int, param: Optional[str] = None, code: Optional[str] = None) -> dict:
    return {"error": {"message": message, "type": _TYPES.get(status, "invalid_request_error"), "param": param,
                      "code": code}}


def error_response(message: str, status: int, param: Optional[str] = None, code: Optional[str] = None,
                   headers: Optional[dict] = None) -> JSONResponse:
    return JSONResponse(error_body(message, status, param, code), status_code=status, headers=headers)


# pydantic puts the member of a union it tried into the error's location ('str', 'list[int]', "literal['never']",
# 'function-after[...]', a model's class name); request fields are snake_case, so none of these names one.
_TYPE_NAMES = frozenset({"str", "int", "bool", "float", "none", "list", "dict"})


def _is_union_tag(part: Any) -> bool:
    return isinstance(part, str) and (part in _TYPE_NAMES or "[" in part or part.startswith("function-")
                                      or part[:1].isupper())


def _field_path(location: Iterable[Any]) -> list:
    """The location's request fields and list indices, without the 'body' root and the union member tags."""
    return [str(part) for part in location if part != "body" and not _is_union_tag(part)]


def _short(text: str, limit: int = 100) -> str:
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def _validation_message(error: dict) -> tuple:
    """(message, param) of pydantic's first error: the field path (without the 'body' root) and what is wrong."""
    if error.get("type") == "extra_forbidden":  # the last part is the unknown name, whatever it looks like
        location = _field_path(error.get("loc", ())[:-1]) + [str(error["loc"][-1])]
    else:
        location = _field_path(error.get("loc", ()))
    param = ".".join(location) or None
    if error.get("type") == "json_invalid":
        return f"the request body is not valid JSON: {error.get('ctx', {}).get('error', error.get('msg'))}", None
    if not location:
        return "the request body must be a JSON object (Content-Type: application/json)", None
    if error.get("type") == "extra_forbidden":
        return f"unknown field {param!r}", param
    received = error.get("input")
    shown = "" if isinstance(received, dict) else f" (got {_short(repr(received))})"
    return f"{param or 'body'}: {error.get('msg')}{shown}", param


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def api_error(_: Request, error: APIError) -> JSONResponse:
        return error_response(error.message, error.status, error.param, error.code)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, error: RequestValidationError) -> JSONResponse:
        errors: Any = error.errors()
        message, param = _validation_message(errors[0]) if errors else ("invalid request", None)
        return error_response(message, 400, param)

    @app.exception_handler(HTTPException)
    async def http_error(_: Request, error: HTTPException) -> JSONResponse:
        code = "file_too_large" if error.status_code == 413 else None
        return error_response(str(error.detail), error.status_code, code=code, headers=getattr(error, "headers", None))

    @app.exception_handler(ClientGone)
    async def client_gone(_: Request, error: ClientGone) -> JSONResponse:
        # Nobody reads this answer: the client has left and its requests are aborted (nginx logs this as 499).
        return error_response("the client closed the connection", 499, code="client_closed_request")

    @app.exception_handler(Exception)
    async def unexpected_error(_: Request, error: Exception) -> JSONResponse:
        logger.exception("unexpected error while serving a request")
        return error_response(f"internal error: {type(error).__name__}: {error}", 500)
