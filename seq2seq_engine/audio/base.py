"""What every audio module shares: the 16 kHz sample rate audio is decoded to and the AudioError they raise."""
from __future__ import annotations

SAMPLE_RATE = 16000


class AudioError(ValueError):
    """Audio could not be loaded or is unusable (names the source and the problem)."""
