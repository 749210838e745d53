"""Drive an EnginePort over a stream of requests and yield the outputs in input order as soon as they are ready.

At most `max_in_flight` requests are queued in the engine at once, so an input file of any length runs in bounded
memory; a request the engine refuses (bad prompt or parameters) yields a StreamError at its place instead of
stopping the stream.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, Iterable, Iterator, Optional, Tuple, Union

from seq2seq_engine.engine_port import EnginePort
from seq2seq_engine.outputs import RequestOutput


@dataclasses.dataclass
class StreamError:
    """An input the engine refused at admission."""

    index: int
    error: str


StreamItem = Union[RequestOutput, StreamError]


def stream_in_order(engine: EnginePort, requests: Iterable[Tuple[Any, Any]], max_in_flight: int = 256,
                    on_finished: Optional[Callable[[], None]] = None) -> Iterator[Tuple[int, StreamItem]]:
    """Yield (input index, RequestOutput or StreamError) in input order. `requests` yields (prompt, params).

    `on_finished` is called once per finished or refused input (e.g. a progress bar's update). If the consumer
    stops early or an error escapes, the requests still in the engine are aborted (their blocks freed).
    """
    if max_in_flight < 1:
        raise ValueError(f"max_in_flight must be >= 1, got {max_in_flight}")
    source = enumerate(iter(requests))
    prefix = f"stream-{id(source)}-"
    ready: Dict[int, StreamItem] = {}
    in_flight: Dict[str, int] = {}
    next_to_yield, exhausted = 0, False
    try:
        while True:
            while not exhausted and len(in_flight) < max_in_flight:
                item = next(source, None)
                if item is None:
                    exhausted = True
                    break
                _admit(engine, prefix, item, in_flight, ready, on_finished)
            if in_flight:
                for output in engine.step(finished_only=True):
                    if output.finished and output.request_id in in_flight:
                        ready[in_flight.pop(output.request_id)] = output
                        if on_finished:
                            on_finished()
            while next_to_yield in ready:
                yield next_to_yield, ready.pop(next_to_yield)
                next_to_yield += 1
            if exhausted and not in_flight and not ready:
                return
    finally:
        if in_flight:
            engine.abort_request(list(in_flight))


def _admit(engine: EnginePort, prefix: str, item: Tuple[int, Tuple[Any, Any]], in_flight: Dict[str, int],
           ready: Dict[int, StreamItem], on_finished: Optional[Callable[[], None]]) -> None:
    index, (prompt, params) = item
    request_id = f"{prefix}{index}"
    try:
        engine.add_request(request_id, prompt, params)
    except (ValueError, TypeError) as error:
        ready[index] = StreamError(index, str(error))
        if on_finished:
            on_finished()
        return
    in_flight[request_id] = index
