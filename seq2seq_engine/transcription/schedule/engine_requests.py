"""A transcription's requests in the engine: added up to the in-flight limit, matched to outputs, aborted."""
from __future__ import annotations

import itertools
import uuid
from typing import Any, Dict, List, Optional

from seq2seq_engine.audio import AudioError
from seq2seq_engine.engine_port import EnginePort
from seq2seq_engine.transcription.schedule.input_source import InputFailed, InputState
from seq2seq_engine.transcription.schedule.window_machine import WindowRequest

_REQUEST_PREFIX = "transcribe"


class RequestsInFlight:
    """The WindowRequests the engine runs, by request id (unique to the job: a prefix and a count), at most `limit`
    at once, each with the call's `lora_request`; each input keeps the ids of its own. Its length is the number in
    flight."""

    def __init__(self, engine: EnginePort, limit: int, lora_request: Optional[Any] = None) -> None:
        self.engine, self.limit, self.lora_request = engine, limit, lora_request
        self.requests: Dict[str, WindowRequest] = {}
        self._ids = itertools.count()
        self._prefix = f"{_REQUEST_PREFIX}-{uuid.uuid4().hex[:8]}-"

    def __len__(self) -> int:
        return len(self.requests)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self.requests

    def has_room(self) -> bool:
        return len(self.requests) < self.limit

    def add(self, request: WindowRequest) -> None:
        """Add the request to the engine (its prompt is made now); InputFailed when the engine refuses it."""
        request_id = f"{self._prefix}{next(self._ids)}"
        try:
            self.engine.add_request(request_id, request.engine_prompt(), request.params,
                                    lora_request=self.lora_request)
        except (AudioError, ValueError, TypeError) as error:
            raise InputFailed(request.input_state, str(error)) from error
        self.requests[request_id] = request
        request.input_state.request_ids.add(request_id)

    def pop_finished(self, output: Any) -> Optional[WindowRequest]:
        """The request `output` finished (it leaves the flight); None for an unfinished or unknown request."""
        request = self.requests.get(output.request_id)
        if request is None or not output.finished:
            return None
        del self.requests[output.request_id]
        request.input_state.request_ids.discard(output.request_id)
        return request

    def abort_input(self, state: InputState) -> None:
        """Abort the input's requests still running."""
        if state.request_ids:
            self._abort(list(state.request_ids))
            state.request_ids.clear()

    def abort_all(self) -> None:
        if self.requests:
            self._abort(list(self.requests))

    def _abort(self, request_ids: List[str]) -> None:
        self.engine.abort_request(request_ids)
        for request_id in request_ids:
            self.requests.pop(request_id, None)
