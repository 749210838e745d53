"""One turn (item) of a live transcription: its audio span, its 30 s parts and their text, its agreed words."""
from __future__ import annotations

import dataclasses
import uuid
from typing import Any, List, Optional, Tuple

import numpy as np

from seq2seq_engine.transcription.live.agreement import LocalAgreement


def new_item_id() -> str:
    return f"item_{uuid.uuid4().hex[:20]}"


@dataclasses.dataclass
class Turn:
    """A turn from sample `start` on. Its audio is cut into parts of at most one 30 s window; `parts` holds each
    part's final text (None while it is decoded) and `waiting` the parts whose decode waits for the text of the
    parts before them (their prompt)."""

    start: int
    item_id: str = dataclasses.field(default_factory=new_item_id)
    part_start: int = 0
    interim_mark: int = 0
    silence_frames: int = 0
    speech_in_part: bool = True
    committed: bool = False
    dropped: bool = False
    end: Optional[int] = None
    parts: List[Optional[str]] = dataclasses.field(default_factory=list)
    waiting: List[Tuple[int, np.ndarray]] = dataclasses.field(default_factory=list)
    agreement: LocalAgreement = dataclasses.field(default_factory=LocalAgreement)
    speculative: Optional[Any] = None   # the Speculation (speculation.py) of the silence heard last, if any

    def __post_init__(self) -> None:
        self.part_start = self.interim_mark = self.start

    def parts_known(self, count: Optional[int] = None) -> bool:
        """Whether the text of the first `count` parts (all by default) is known."""
        return all(text is not None for text in self.parts[:count])

    def text_before(self, count: Optional[int] = None) -> List[str]:
        """The known texts of the first `count` parts, empty ones left out."""
        return [text for text in self.parts[:count] if text]

    @property
    def done(self) -> bool:
        return self.committed and not self.waiting and self.parts_known()

    @property
    def words(self) -> List[str]:
        return " ".join(self.text_before()).split()

    @property
    def waiting_samples(self) -> int:
        return sum(len(samples) for _, samples in self.waiting)
