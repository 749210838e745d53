"""Voice activity detection: speech regions of a recording from Silero VAD probabilities (faster-whisper semantics)."""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from seq2seq_engine.errors import ParameterError, ParameterTypeError

from .base import SAMPLE_RATE
from .silero import BLOCK_FRAMES, FRAME_SAMPLES, load_silero_vad
from .stream import iter_windows

Region = Tuple[int, int]  # [start, end) in samples of the 16 kHz recording

# A silence this long inside a region is a place where a region reaching max_speech_duration_s may be cut.
MIN_SILENCE_AT_MAX_SPEECH_MS = 98


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


def stream_speech_regions(source: Any, options: VadOptions,
                          max_seconds: Optional[float] = None) -> Tuple[List[Region], int]:
    """(`speech_regions`, length in samples) of a file or audio decoded as a stream of Silero blocks (~131 s each,
    one held at a time); AudioTooLong as soon as the audio passes `max_seconds`, before reading further."""
    count = 0

    def blocks() -> Iterator[np.ndarray]:
        nonlocal count
        for block in iter_windows(source, BLOCK_FRAMES * FRAME_SAMPLES, max_seconds=max_seconds):
            count += len(block)
            yield block
            del block

    probabilities = load_silero_vad().stream_probabilities(blocks())
    return regions_from_probabilities(probabilities, count, options), count


def regions_from_probabilities(probabilities: Sequence[float], n_samples: int, options: VadOptions) -> List[Region]:
    """Speech regions from per-frame (512-sample) speech probabilities: detection, then padding."""
    return _pad(_detect(probabilities, n_samples, options), n_samples, options.speech_pad_ms * SAMPLE_RATE / 1000)


def _detect(probabilities: Sequence[float], n_samples: int, options: VadOptions) -> List[Region]:
    """Unpadded regions, with the rules of Silero's `get_speech_timestamps` as faster-whisper runs it.

    Speech starts at a frame >= threshold. Inside speech, a run of frames < neg_threshold is a silence; frames
    between the thresholds continue whatever run they are in. A silence of min_silence_duration_ms ends the region
    where the silence began (regions not longer than min_speech_duration_ms are dropped). A region that grows past
    the maximum is cut at the start of its last silence of more than 98 ms, and speech that resumed after that
    silence opens the next region; with no such silence it is cut at the current frame.
    """
    rate = SAMPLE_RATE / 1000
    threshold = options.threshold
    negative = options.neg_threshold if options.neg_threshold is not None else max(threshold - 0.15, 0.01)
    min_speech = options.min_speech_duration_ms * rate
    min_silence = options.min_silence_duration_ms * rate
    cut_silence = MIN_SILENCE_AT_MAX_SPEECH_MS * rate
    max_speech = options.max_speech_duration_s * SAMPLE_RATE - FRAME_SAMPLES - 2 * options.speech_pad_ms * rate
    regions: List[Region] = []
    start: Optional[int] = None  # the open region's first sample, None outside speech
    silence_from = 0  # where the current silence began (0: no silence under way)
    cut_at = 0  # the start of the open region's last silence longer than 98 ms (0: none)
    resume_at = 0  # where speech came back after that silence
    for index, probability in enumerate(probabilities):
        here = index * FRAME_SAMPLES
        if probability >= threshold and silence_from:
            silence_from = 0
            if resume_at < cut_at:
                resume_at = here
        if probability >= threshold and start is None:
            start = here
            continue
        if start is not None and here - start > max_speech:
            if cut_at:
                regions.append((start, cut_at))
                start = resume_at if resume_at >= cut_at else None
            else:
                regions.append((start, here))
                start = None
            cut_at = resume_at = silence_from = 0
            if start is None:
                continue
        if start is not None and probability < negative:
            silence_from = silence_from or here
            if here - silence_from > cut_silence:
                cut_at = silence_from
            if here - silence_from < min_silence:
                continue
            if silence_from - start > min_speech:
                regions.append((start, silence_from))
            start = None
            cut_at = resume_at = silence_from = 0
    if start is not None and n_samples - start > min_speech:
        regions.append((start, n_samples))
    return regions


def _pad(regions: List[Region], n_samples: int, pad: float) -> List[Region]:
    """Widen each region by `pad` samples on both sides; two regions closer than 2 * pad share the gap."""
    starts = [start for start, _ in regions]
    ends = [end for _, end in regions]
    for k in range(len(regions)):
        if k == 0:
            starts[0] = int(max(0, starts[0] - pad))
        if k == len(regions) - 1:
            ends[k] = int(min(n_samples, ends[k] + pad))
            continue
        gap = regions[k + 1][0] - regions[k][1]
        if gap < 2 * pad:
            ends[k] += gap // 2
            starts[k + 1] = int(max(0, starts[k + 1] - gap // 2))
        else:
            ends[k] = int(min(n_samples, ends[k] + pad))
            starts[k + 1] = int(max(0, starts[k + 1] - pad))
    return list(zip(starts, ends))
