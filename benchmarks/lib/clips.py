"""The pytest-audioeval speech clips the Whisper benchmarks run: loaded, repeated, or joined into one long file."""
from __future__ import annotations

import dataclasses
import glob
import importlib.util
import os
from typing import List, Optional

import numpy as np

from seq2seq_engine.audio import SAMPLE_RATE, load_audio


@dataclasses.dataclass
class Clip:
    name: str
    language: str          # the folder's language (the reference's)
    samples: np.ndarray
    reference: Optional[str]


def sample_dir() -> str:
    spec = importlib.util.find_spec("pytest_audioeval")
    if spec is None:
        raise SystemExit("pytest-audioeval is not installed")
    return os.path.join(list(spec.submodule_search_locations)[0], "samples", "audio")


def load_clips(which: str, repeat_to: int) -> List[Clip]:
    clips = []
    for path in sorted(glob.glob(os.path.join(sample_dir(), "*", "*.wav"))):
        language = os.path.basename(os.path.dirname(path))
        if which == "en" and language != "en":
            continue
        ref_path = path[:-4] + ".txt"
        reference = open(ref_path, encoding="utf-8").read().strip() if os.path.exists(ref_path) else None
        clips.append(Clip(f"{language}/{os.path.basename(path)}", language, load_audio(path), reference))
    base = list(clips)
    while len(clips) < repeat_to:
        # each repeat slightly quieter: the same speech, other features, so no engine's encoder cache (ours keeps
        # a window's encoder output by its features) reuses the work of an earlier copy, as in a folder of recordings
        clip, repeat = base[len(clips) % len(base)], len(clips) // len(base)
        clips.append(dataclasses.replace(clip, samples=(clip.samples * (1.0 - 0.002 * repeat)).astype(np.float32)))
    return clips[:repeat_to] if repeat_to else clips


def long_clip(clips: List[Clip], seconds: float) -> Clip:
    """Clips joined with 1 s silences (cycling) up to `seconds`; the reference is their references joined."""
    pieces, refs, total, i = [], [], 0, 0
    silence = np.zeros(SAMPLE_RATE, np.float32)
    while total < seconds * SAMPLE_RATE:
        clip = clips[i % len(clips)]
        pieces += [clip.samples, silence]
        refs.append(clip.reference or "")
        total += len(clip.samples) + len(silence)
        i += 1
    return Clip(f"long({i} clips)", clips[0].language, np.concatenate(pieces), " ".join(refs))
