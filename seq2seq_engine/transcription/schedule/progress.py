"""The transcription progress bar: seconds of audio done of the total, the speed as a multiple of real time, ETA."""
from __future__ import annotations

from typing import Any, Dict

from tqdm.auto import tqdm

from seq2seq_engine.audio import SAMPLE_RATE

BAR_FORMAT = "{l_bar}{bar}| {n:.1f}/{total:.1f} s audio [{elapsed}<{remaining}, {realtime}]"


class AudioProgress(tqdm):
    """A tqdm bar counted in 16 kHz samples (exact integers) and shown in seconds, with `{realtime}`: audio seconds
    transcribed per wall-clock second since the start ("12.3x realtime")."""

    @property
    def format_dict(self) -> Dict[str, Any]:
        values = super().format_dict
        elapsed = values.get("elapsed") or 0.0
        audio_seconds = values.get("n", 0) / SAMPLE_RATE
        values["realtime"] = f"{audio_seconds / elapsed:.1f}x realtime" if elapsed > 0 else "-x realtime"
        return values

    def add_total(self, samples: int) -> None:
        """Grow (or shrink) the total as an input's real length becomes known."""
        if samples and not self.disable:
            self.total += samples
            self.refresh()


def audio_progress(total_samples: int, enabled: bool, desc: str = "Transcribed audio") -> AudioProgress:
    """A progress bar over `total_samples` 16 kHz samples (the pipeline grows or shrinks the total as it learns
    each input's real length); `enabled=False` gives a silent one."""
    return AudioProgress(total=total_samples, unit="s", unit_scale=1 / SAMPLE_RATE, desc=desc, disable=not enabled,
                         bar_format=BAR_FORMAT)
