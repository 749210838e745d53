"""The speculative final decode of a live turn: once the VAD has heard a short silence, the turn's audio so far is
decoded as if the turn had ended; if the silence lasts until the turn ends, that decode is its final part."""
from __future__ import annotations

import dataclasses
from typing import List, Optional

from seq2seq_engine.transcription.live.turn import Turn


@dataclasses.dataclass
class Speculation:
    """A decode of the turn's part `index` up to sample `end`, forced to start with `prefix` (the deltas sent);
    `text` once it finished. A turn holds at most one; speech again makes it stale (the turn drops it)."""

    request_id: str
    end: int
    index: int
    prefix: Optional[str]
    text: Optional[str] = None


def final_prefix(turn: Turn, index: int) -> Optional[str]:
    """The text the final decode of part `index` is forced to start with: the words sent as deltas beyond the parts
    before it, while the interim decodes still agree with them (None: a plain decode)."""
    before = " ".join(turn.text_before(index)).split()
    sent: List[str] = turn.agreement.emitted
    agreed = sent[:len(before)] == before and turn.agreement.holds()
    return (" ".join(sent[len(before):]) if agreed else "") or None


def adoptable(turn: Turn, pending: bool) -> Optional[Speculation]:
    """The turn's speculation, when it can be its last part now: it covers the part that comes next, was made with
    the prefix the final decode would get now or a shorter one (an interim decode running beside it agreed more
    words since; they come from audio it covers too), and is in flight (`pending`) or finished."""
    speculation = turn.speculative
    if speculation is None or speculation.index != len(turn.parts):
        return None
    if not _extends(final_prefix(turn, speculation.index), speculation.prefix):
        return None
    return speculation if pending or speculation.text is not None else None


def _extends(prefix: Optional[str], start: Optional[str]) -> bool:
    """Whether the words of `prefix` begin with the words of `start`. A decode made without a forced start (None)
    is the plain decode, always usable; one forced with words the final decode would no longer get (`prefix` None:
    the interim decodes stopped agreeing with them) is not."""
    if start is None:
        return True
    return prefix is not None and prefix.split()[:len(start.split())] == start.split()
