"""Voice activity detection: speech regions of a recording from Silero VAD probabilities (faster-whisper semantics)."""
from __future__ import annotations

import dataclasses
import math
from typing import Any, List, Optional, Sequence

import numpy as np

from seq2seq_engine.errors import ParameterError, ParameterTypeError

from .base import SAMPLE_RATE
from .silero import FRAME_SAMPLES, load_silero_vad
from .vad_online import Region, RegionDetector, RegionPadder


@dataclasses.dataclass(frozen=True)
class VadOptions:
    """Speech detection settings, as faster-whisper's `VadOptions` (same names and meanings), with the defaults of
    its batched pipeline, whose packing of speech into 30 s windows transcription follows: min_silence_duration_ms
    160, not the 2,000 of its sequential one (decisions §49).

    threshold: a frame whose speech probability is at least this is speech.
    neg_threshold: inside speech, only a frame below this counts as silence (default max(threshold - 0.15, 0.01)).
    min_speech_duration_ms: regions this short or shorter (before padding) are dropped.
    max_speech_duration_s: longer speech is cut, at the last silence of more than 98 ms if there is one, else
        where the limit is reached; padded regions stay within it. transcribe() caps it at the 30 s window.
    min_silence_duration_ms: a region ends only after this much silence.
    speech_pad_ms: each region is widened by this much on both sides (by half the gap where two regions are
        closer than twice this).
    """

    threshold: float = 0.5
    neg_threshold: Optional[float] = None
    min_speech_duration_ms: float = 0
    max_speech_duration_s: float = float("inf")
    min_silence_duration_ms: float = 160
    speech_pad_ms: float = 400

    def __post_init__(self) -> None:
        for name in ("threshold", "neg_threshold"):
            value = getattr(self, name)
            if value is not None and (not _is_number(value) or not 0.0 <= value <= 1.0):
                raise ValueError(f"vad {name} must be a number from 0 to 1, got {value!r}")
        for name in ("min_speech_duration_ms", "min_silence_duration_ms", "speech_pad_ms", "max_speech_duration_s"):
            value = getattr(self, name)
            if not _is_number(value) or value < 0 or math.isnan(value):
                raise ValueError(f"vad {name} must be a number >= 0, got {value!r}")
        # A cut region is at most max_speech_duration_s - one frame - both pads long before padding.
        if self.max_speech_duration_s * 1000 <= 2 * self.speech_pad_ms + 1000 * FRAME_SAMPLES / SAMPLE_RATE:
            raise ValueError(f"vad max_speech_duration_s ({self.max_speech_duration_s}) must exceed twice "
                             f"speech_pad_ms ({self.speech_pad_ms} ms) plus one 32 ms frame")

    @classmethod
    def from_parameters(cls, parameters: Any = None, **overrides: Any) -> "VadOptions":
        """VadOptions from None (defaults), a dict of fields or a VadOptions; `overrides` are applied last."""
        if parameters is None:
            parameters = {}
        elif isinstance(parameters, VadOptions):
            parameters = dataclasses.asdict(parameters)
        elif not isinstance(parameters, dict):
            raise ParameterTypeError(f"vad_parameters must be a dict or VadOptions, got {type(parameters).__name__}",
                                     "vad_parameters")
        fields = {field.name for field in dataclasses.fields(cls)}
        unknown = sorted(set(parameters) - fields)
        if unknown:
            raise ParameterError(f"unknown vad_parameters {unknown}; the fields are {sorted(fields)}", "vad_parameters")
        return cls(**{**parameters, **overrides})


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)


def speech_regions(audio: np.ndarray, options: Optional[VadOptions] = None) -> List[Region]:
    """Padded speech regions of 16 kHz mono `audio`, in order, as [start, end) samples (Silero VAD)."""
    options = options or VadOptions()
    probabilities = load_silero_vad().probabilities(audio)
    return regions_from_probabilities(probabilities, len(audio), options)


def regions_from_probabilities(probabilities: Sequence[float], n_samples: int, options: VadOptions) -> List[Region]:
    """Speech regions from per-frame (512-sample) speech probabilities: detection, then padding."""
    return _pad(_detect(probabilities, n_samples, options), n_samples, options.speech_pad_ms * SAMPLE_RATE / 1000)


def _detect(probabilities: Sequence[float], n_samples: int, options: VadOptions) -> List[Region]:
    """Unpadded regions (vad_online.py: RegionDetector's rules)."""
    detector = RegionDetector(options)
    regions = [region for probability in probabilities for region in detector.push(probability)]
    return regions + detector.finish(n_samples)


def _pad(regions: List[Region], n_samples: int, pad: float) -> List[Region]:
    """Widen each region by `pad` samples on both sides; two regions closer than 2 * pad share the gap."""
    padder = RegionPadder(pad)
    return [padded for region in regions for padded in padder.push(region)] + padder.finish(n_samples)
