"""The errors that name the parameter a value was refused for, so callers read the field from the type, not the text."""
from __future__ import annotations

from typing import Optional, Tuple


class InvalidParameter(Exception):
    """A value one parameter cannot take. `param`: the parameter as the Python API spells it (a field of
    SamplingParams, TranscriptionOptions, ...); `requirement`, when known: what the value must be, in the message's
    words ("an int >= 1"). Raised as ParameterError or ParameterTypeError, never itself."""

    def __init__(self, message: str, param: str, requirement: Optional[str] = None) -> None:
        super().__init__(message)
        self.param, self.requirement = param, requirement

    def __reduce__(self) -> tuple:
        # pickle (Ray, a worker process) rebuilds an exception from its args alone, which hold only the message
        return type(self), (self.args[0], self.param, self.requirement)


class ParameterError(InvalidParameter, ValueError):
    """A value out of a parameter's range or form (every `except ValueError` still catches it)."""


class ParameterTypeError(InvalidParameter, TypeError):
    """A value of the wrong type for a parameter (every `except TypeError` still catches it)."""


class LoRAAdapterError(ParameterError):
    """An adapter that cannot be served: its directory or files missing or malformed, or a module or setting the
    engine does not adapt (the message names the adapter and the module). The parameter is the request's
    `lora_request` unless another is named."""

    def __init__(self, message: str, param: str = "lora_request", requirement: Optional[str] = None) -> None:
        super().__init__(message, param, requirement)


def param_of(error: BaseException) -> Optional[str]:
    """The parameter `error` names; None for an error about no single parameter."""
    return error.param if isinstance(error, InvalidParameter) else None


def over_limit(subject: str, size: int, limit: int, unit: str) -> Optional[Tuple[str, str]]:
    """(message, OpenAI's error code) when `size` (a count of `unit`: "characters", "bytes", "entries", ...) is over
    `limit`, else None: the one wording of a too-long value, over HTTP and WebSocket alike."""
    if size <= limit:
        return None
    code = "string_above_max_length" if unit in ("characters", "bytes") else "array_above_max_length"
    return f"{subject} has {size} {unit}, more than the limit of {limit}", code
