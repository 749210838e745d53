"""The decode requests of a live transcription: queued for its owner, pending until their output, withdrawn (or
marked stale for the owner to abort) when nobody needs their output any more."""
from __future__ import annotations

from typing import Any, Dict, List, NamedTuple, Optional

from seq2seq_engine.transcription.live.decode_request import DecodeRequest

INTERIM, PART, DETECT, SPECULATIVE = "interim", "part", "language", "speculative"
BEST_EFFORT = (INTERIM, SPECULATIVE)  # decodes an owner whose engine is busy may drop


class Pending(NamedTuple):
    """What a request decodes: the turn (None for a language detection), its kind, the turn's part index, and the
    text forced as the start of the part's text."""

    turn: Any
    kind: str
    index: int
    prefix: Optional[str]


class RequestBook:
    """Queued requests (not handed out yet), pending ones (handed out or queued, output not in), the one interim
    decode, and the stale ids the owner must abort. At most `max_final_in_flight` final decodes (parts and the
    language detection) are handed out and unfinished at once; the others wait in the queue, in order."""

    def __init__(self, max_final_in_flight: int = 1) -> None:
        self.max_final_in_flight = max_final_in_flight
        self._queue: List[DecodeRequest] = []
        self._pending: Dict[str, Pending] = {}
        self._submitted: set = set()
        self._stale: List[str] = []
        self.interim: Optional[str] = None

    def add(self, request: DecodeRequest, entry: Pending) -> None:
        self._queue.append(request)
        self._pending[request.request_id] = entry
        if entry.kind == INTERIM:
            self.interim = request.request_id

    def take(self, best_effort: bool) -> List[DecodeRequest]:
        """The queued requests to run now, each once: the final ones while fewer than `max_final_in_flight` are
        handed out, and the best-effort ones (interim, speculative), which without `best_effort` are dropped."""
        room = self.max_final_in_flight - self.finals_in_flight
        out: List[DecodeRequest] = []
        kept: List[DecodeRequest] = []
        for request in self._queue:
            if self._pending[request.request_id].kind in BEST_EFFORT:
                if best_effort:
                    out.append(request)
                else:
                    self.forget(request.request_id)
            elif room > 0:
                out.append(request)
                room -= 1
            else:
                kept.append(request)
        self._queue = kept
        self._submitted.update(r.request_id for r in out)
        return out

    @property
    def finals_in_flight(self) -> int:
        """Final decodes handed out whose output is not in."""
        return sum(1 for rid in self._submitted if self._pending[rid].kind not in BEST_EFFORT)

    @property
    def finals_queued(self) -> int:
        """Final decodes waiting to be handed out (the in-flight bound holds them back)."""
        return sum(1 for r in self._queue if self._pending[r.request_id].kind not in BEST_EFFORT)

    def queued(self, kind: str) -> bool:
        """Whether a request of `kind` waits to be handed out."""
        return any(self._pending[r.request_id].kind == kind for r in self._queue)

    def take_stale(self) -> List[str]:
        stale, self._stale = self._stale, []
        return stale

    def entry(self, request_id: str) -> Pending:
        """The pending entry of a handed-out request (ValueError for any other id)."""
        if request_id not in self._submitted:
            raise ValueError(f"request_id {request_id!r} is not a pending request of this live transcription")
        return self._pending[request_id]

    def entry_of(self, request_id: Optional[str]) -> Optional[Pending]:
        """The entry of a pending request, handed out or queued (None for any other id)."""
        return self._pending.get(request_id) if request_id is not None else None

    def retarget(self, request_id: str, entry: Pending) -> None:
        """A pending request now decodes what `entry` says (a speculative decode adopted as a turn's part)."""
        self._pending[request_id] = entry

    def withdraw(self, request_id: Optional[str]) -> None:
        """Nobody needs this request's output: unqueued if not handed out yet, else marked stale; forgotten."""
        if request_id is None or request_id not in self._pending:
            return
        if request_id in self._submitted:
            self._stale.append(request_id)
        self._queue = [r for r in self._queue if r.request_id != request_id]
        self.forget(request_id)

    def drop_turn(self, turn: Any) -> None:
        """The turn was cleared: its queued requests go; handed-out ones stay pending (the owner aborts them on
        close) and their outputs change nothing."""
        dropped = {rid for rid, entry in self._pending.items() if entry.turn is turn}
        self._queue = [r for r in self._queue if r.request_id not in dropped]
        for request_id in dropped - self._submitted:
            self.forget(request_id)

    def forget(self, request_id: str) -> None:
        self._pending.pop(request_id, None)
        self._submitted.discard(request_id)
        if self.interim == request_id:
            self.interim = None

    def submitted_ids(self) -> List[str]:
        return sorted(self._submitted)
