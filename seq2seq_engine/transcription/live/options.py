"""The settings of a live transcription: turn detection (server VAD) and the options of the whole stream."""
from __future__ import annotations

import dataclasses
from typing import Optional

from seq2seq_engine.errors import ParameterError

# A Whisper prompt keeps only its last 223 tokens (about 900 characters of English): 32768 characters cover it about
# 36 times over; a longer text only costs its tokenization at every decode.
MAX_PROMPT_CHARS = 32_768


@dataclasses.dataclass(frozen=True)
class TurnDetection:
    """Server VAD: speech starts at a frame whose probability is >= threshold (the item's audio begins
    prefix_padding_ms before it) and stops after silence_duration_ms of frames below it."""

    threshold: float = 0.5
    prefix_padding_ms: int = 300
    silence_duration_ms: int = 500

    def __post_init__(self) -> None:
        if not isinstance(self.threshold, (int, float)) or not 0.0 < self.threshold < 1.0:
            raise ParameterError(f"threshold must be a number in (0, 1), got {self.threshold!r}", "threshold")
        for name, limit in (("prefix_padding_ms", 10_000), ("silence_duration_ms", 10_000)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= limit:
                raise ParameterError(f"{name} must be an integer in [0, {limit}], got {value!r}", name)


@dataclasses.dataclass(frozen=True)
class LiveOptions:
    """language (None: English for English-only models; a multilingual model's is detected once, on the first
    speech decoded, and kept for the whole stream), prompt (text the turns are conditioned on),
    turn_detection (None: only commit() ends a turn), interim_interval_s (audio between interim decodes),
    max_buffered_s (the most audio held and not yet decoding: the turn being spoken is committed early beyond it, and
    an append while more is held is refused: its owner waits while the session is `backlogged`),
    max_decodes_in_flight (final decodes handed out and unfinished at once; the others wait their turn),
    speculative_silence_ms (with server VAD: after this much silence the turn is decoded as if it had ended, and
    that decode is its final one if the silence lasts; None: the final decode starts when the turn ends)."""

    language: Optional[str] = None
    prompt: Optional[str] = None
    turn_detection: Optional[TurnDetection] = TurnDetection()
    interim_interval_s: float = 1.0
    max_buffered_s: float = 60.0
    speculative_silence_ms: Optional[int] = 160
    max_decodes_in_flight: int = 1

    def __post_init__(self) -> None:
        if self.language is not None and (not isinstance(self.language, str) or not self.language.strip()):
            raise ParameterError(f"language must be None or a non-empty string, got {self.language!r}", "language")
        if self.prompt is not None and not isinstance(self.prompt, str):
            raise ParameterError(f"prompt must be None or a string, got {type(self.prompt).__name__}", "prompt")
        if self.prompt is not None and len(self.prompt) > MAX_PROMPT_CHARS:
            raise ParameterError(f"prompt has {len(self.prompt)} characters, more than the limit of {MAX_PROMPT_CHARS}",
                                 "prompt")
        if self.turn_detection is not None and not isinstance(self.turn_detection, TurnDetection):
            raise ParameterError(f"turn_detection must be None or a TurnDetection, got {self.turn_detection!r}",
                                 "turn_detection")
        if not isinstance(self.interim_interval_s, (int, float)) or not 0.1 <= self.interim_interval_s <= 30.0:
            raise ParameterError(f"interim_interval_s must be in [0.1, 30], got {self.interim_interval_s!r}",
                                 "interim_interval_s")
        if not isinstance(self.max_buffered_s, (int, float)) or not 1.0 <= self.max_buffered_s <= 3600.0:
            raise ParameterError(f"max_buffered_s must be in [1, 3600], got {self.max_buffered_s!r}", "max_buffered_s")
        speculative = self.speculative_silence_ms
        if speculative is not None and (isinstance(speculative, bool) or not isinstance(speculative, int)
                                        or not 0 <= speculative <= 10_000):
            raise ParameterError(f"speculative_silence_ms must be None or an integer in [0, 10000], got "
                                 f"{speculative!r}", "speculative_silence_ms")
        in_flight = self.max_decodes_in_flight
        if isinstance(in_flight, bool) or not isinstance(in_flight, int) or not 1 <= in_flight <= 64:
            raise ParameterError(f"max_decodes_in_flight must be an integer in [1, 64], got {in_flight!r}",
                                 "max_decodes_in_flight")
