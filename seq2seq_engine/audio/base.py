"""What every audio module shares: the 16 kHz sample rate audio is decoded to and the AudioError they raise."""
from __future__ import annotations

SAMPLE_RATE = 16000


class AudioError(ValueError):
    """Audio could not be loaded or is unusable (names the source and the problem)."""


class AudioTooLong(AudioError):
    """The audio lasts longer than the limit its reader was given (`max_audio_seconds`)."""

    def __init__(self, name: str, limit: float, declared: "float | None" = None) -> None:
        said = f": its container declares {declared:.1f} s" if declared is not None else ""
        super().__init__(f"{name}: the audio is longer than max_audio_seconds ({limit:g} s){said}")
        self.limit = limit
