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
    decode, and the stale ids the owner must abort."""

    def __init__(self) -> None:
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
        """The queued requests, each once; without `best_effort` the interim and speculative ones are dropped."""
        out, self._queue = self._queue, []
        if not best_effort:
            dropped = [r for r in out if self._pending[r.request_id].kind in BEST_EFFORT]
            for request in dropped:
                self.forget(request.request_id)
            out = [r for r in out if r not in dropped]
        self._submitted.update(r.request_id for r in out)
        return out

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
