"""Long test recordings built on the machine: speech clips and espeak-ng sentences between pauses, noise and tones."""
from __future__ import annotations

import dataclasses
import glob
import importlib.util
import json
import os
import shutil
import subprocess
import tempfile
from typing import Callable, List, Optional, Sequence, Tuple

import numpy as np

from seq2seq_engine.audio import SAMPLE_RATE, load_audio

# Spoken by espeak-ng (reference = the sentence); fixed, so every machine builds the same recordings.
SENTENCES = [
    "The quarterly report shows that sales grew in every region except the north.",
    "Please remember to close the windows before you leave the building tonight.",
    "Our next meeting is scheduled for Thursday afternoon at three o'clock.",
    "The train to the airport leaves from platform four every twenty minutes.",
    "She opened the letter slowly and read it twice before saying anything.",
    "We need a better plan for the migration of the old database.",
    "The weather forecast says it will rain for most of the weekend.",
    "He bought fresh bread, a bottle of milk and some apples at the market.",
    "The new software update fixes several bugs and improves the battery life.",
    "Children were playing football in the park until it got dark.",
    "Could you send me the final version of the contract by Friday?",
    "The museum is closed on Mondays but open late on Wednesday evenings.",
    "After the long winter, the garden finally started to turn green again.",
    "The engineers tested the bridge for three weeks before it was opened.",
    "I think we should hire two more people for the support team.",
    "The library has a large collection of old maps and rare books.",
    "Turn left at the second traffic light and the hotel is on your right.",
    "The doctor told him to drink more water and to sleep at least eight hours.",
    "Our customers asked for a simpler way to export their data.",
    "The concert was cancelled because the singer had lost her voice.",
    "Mountains covered in snow could be seen from the kitchen window.",
    "The budget for next year will be presented to the board in March.",
    "A small boat drifted slowly across the lake in the morning fog.",
    "Nobody expected the project to be finished two weeks ahead of schedule.",
]
VOICES = ["en-us", "en", "en-us+f3", "en+m3"]
GAP_KINDS = ["silence", "noise", "music"]


@dataclasses.dataclass
class Part:
    kind: str        # "speech", "silence", "noise" or "music"
    start: float     # seconds in the recording
    end: float
    text: str = ""   # the reference of a speech part


@dataclasses.dataclass
class Recording:
    name: str
    samples: np.ndarray   # 16 kHz mono float32
    parts: List[Part]

    @property
    def duration(self) -> float:
        return len(self.samples) / SAMPLE_RATE

    @property
    def reference(self) -> str:
        return " ".join(p.text for p in self.parts if p.kind == "speech")

    @property
    def speech_spans(self) -> List[Tuple[float, float]]:
        return [(p.start, p.end) for p in self.parts if p.kind == "speech"]


def audioeval_clips() -> List[Tuple[np.ndarray, str]]:
    """The English clips of pytest-audioeval with their reference text (none if the package is missing)."""
    spec = importlib.util.find_spec("pytest_audioeval")
    if spec is None:
        return []
    folder = os.path.join(list(spec.submodule_search_locations)[0], "samples", "audio", "en")
    clips = []
    for path in sorted(glob.glob(os.path.join(folder, "*.wav"))):
        with open(path[:-4] + ".txt", encoding="utf-8") as f:
            clips.append((load_audio(path), f.read().strip()))
    return clips


def have_espeak() -> bool:
    return shutil.which("espeak-ng") is not None


def espeak(text: str, voice: str, speed: int) -> np.ndarray:
    """`text` spoken by espeak-ng, resampled to 16 kHz."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "utterance.wav")
        subprocess.run(["espeak-ng", "-v", voice, "-s", str(speed), "-w", path, text], check=True,
                       capture_output=True)
        return load_audio(path)


def trim(samples: np.ndarray, threshold: float = 1e-3) -> np.ndarray:
    """Without the leading and trailing near-silence (so a speech span is where the speech is)."""
    loud = np.flatnonzero(np.abs(samples) > threshold)
    return samples[loud[0]:loud[-1] + 1] if len(loud) else samples[:0]


def gap_audio(kind: str, seconds: float, rng: np.random.Generator) -> np.ndarray:
    """A non-speech stretch: near silence, band-limited noise, or chords of decaying tones (music-like)."""
    n = int(seconds * SAMPLE_RATE)
    if kind == "silence":
        return rng.normal(0, 3e-4, n).astype(np.float32)
    if kind == "noise":
        white = rng.normal(0, 1, n + 64)
        coloured = np.convolve(white, np.ones(64) / 64, mode="valid")[:n]   # low-passed: a hum / fan noise
        level = rng.uniform(0.01, 0.05) / (np.std(coloured) + 1e-9)
        return (coloured * level).astype(np.float32)
    t = np.arange(n) / SAMPLE_RATE
    out = np.zeros(n)
    note = int(rng.uniform(0.25, 0.6) * SAMPLE_RATE)
    for start in range(0, n, note):
        seg = t[start:start + note] - t[start]
        base = 220 * 2 ** (rng.integers(0, 12) / 12)
        for ratio in (1.0, 1.25, 1.5):   # a major chord
            out[start:start + note] += np.sin(2 * np.pi * base * ratio * seg) * np.exp(-3 * seg)
    return (out * rng.uniform(0.03, 0.1) / 3).astype(np.float32)


def utterance_pool(rng: np.random.Generator) -> List[Tuple[np.ndarray, str]]:
    """Every audioeval clip and every sentence (in a random espeak-ng voice and speed; none without espeak-ng),
    trimmed."""
    pool = [(trim(samples), text) for samples, text in audioeval_clips()]
    for sentence in SENTENCES if have_espeak() else []:
        voice = VOICES[int(rng.integers(len(VOICES)))]
        pool.append((trim(espeak(sentence, voice, int(rng.integers(140, 185)))), sentence))
    return pool


class RecordingBuilder:
    """A recording laid out piece by piece, each piece with its Part; `build` adds the low noise floor."""

    def __init__(self) -> None:
        self.pieces: List[np.ndarray] = []
        self.parts: List[Part] = []
        self.position = 0   # samples so far

    def add(self, kind: str, samples: np.ndarray, text: str = "") -> None:
        start = self.position
        self.pieces.append(samples.astype(np.float32))
        self.position += len(samples)
        self.parts.append(Part(kind, start / SAMPLE_RATE, self.position / SAMPLE_RATE, text))

    def build(self, name: str, rng: np.random.Generator) -> Recording:
        audio = np.concatenate(self.pieces)
        audio += rng.normal(0, 2e-3, len(audio)).astype(np.float32)
        return Recording(name, np.clip(audio, -1, 1).astype(np.float32), self.parts)


def compose(name: str, utterances: Sequence[Tuple[np.ndarray, str]], seconds: float,
            rng: np.random.Generator) -> Recording:
    """Utterances in random order separated by random gaps (0.3-8 s of silence, noise or music) up to `seconds`;
    a gap opens and closes the recording, and a low noise floor runs under everything."""
    recording = RecordingBuilder()
    order = rng.permutation(len(utterances))
    recording.add("silence", gap_audio("silence", rng.uniform(0.5, 2.0), rng))
    i = 0
    while recording.position < seconds * SAMPLE_RATE:
        samples, text = utterances[order[i % len(order)]]
        i += 1
        recording.add("speech", samples * rng.uniform(0.6, 1.0), text)
        kind = GAP_KINDS[int(rng.choice(3, p=[0.4, 0.3, 0.3]))]
        recording.add(kind, gap_audio(kind, rng.uniform(0.3, 8.0), rng))
    return recording.build(name, rng)


def build_recordings(count: int, seconds: float, seed: int = 0) -> List[Recording]:
    """`count` recordings of about `seconds` each, each with its own order, voices, gaps and levels."""
    rng = np.random.default_rng(seed)
    pool = utterance_pool(rng)
    if not pool:
        raise SystemExit("no speech to build recordings from: install pytest-audioeval and/or espeak-ng")
    return [compose(f"long{i + 1}", pool, seconds, np.random.default_rng([seed, i])) for i in range(count)]


def write(recording: Recording, folder: str) -> str:
    """<name>.wav, <name>.txt (the reference) and <name>.json (the parts); returns the WAV's path."""
    import soundfile
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, recording.name + ".wav")
    soundfile.write(path, recording.samples, SAMPLE_RATE, subtype="PCM_16")
    with open(os.path.join(folder, recording.name + ".txt"), "w", encoding="utf-8") as f:
        f.write(recording.reference + "\n")
    with open(os.path.join(folder, recording.name + ".json"), "w", encoding="utf-8") as f:
        json.dump({"duration": recording.duration, "parts": [dataclasses.asdict(p) for p in recording.parts]}, f,
                  indent=1)
    return path


def build_and_write(count: int, seconds: float, folder: Optional[str] = None, seed: int = 0) -> List[str]:
    """Build the recordings and write them under `folder` (default: a fresh temp folder); their WAV paths."""
    folder = folder or tempfile.mkdtemp(prefix="bench-long-audio-")
    return [write(recording, folder) for recording in build_recordings(count, seconds, seed)]


def load_parts(wav_path: str) -> List[Part]:
    with open(wav_path[:-4] + ".json", encoding="utf-8") as f:
        return [Part(**p) for p in json.load(f)["parts"]]


def gaps(parts: Sequence[Part], margin: float = 0.5) -> List[Tuple[float, float]]:
    """The non-speech stretches between (and around) the speech spans, each shrunk by `margin` seconds where it
    touches speech (timestamp slack); stretches that vanish are dropped."""
    stretches: List[Tuple[float, float]] = []
    for part in parts:
        if part.kind == "speech":
            continue
        if stretches and abs(stretches[-1][1] - part.start) < 1e-9:
            stretches[-1] = (stretches[-1][0], part.end)
        else:
            stretches.append((part.start, part.end))
    speech = [(p.start, p.end) for p in parts if p.kind == "speech"]
    shrunk = []
    for start, end in stretches:
        start += margin if any(abs(s_end - start) < 1e-9 for _, s_end in speech) else 0.0
        end -= margin if any(abs(s_start - end) < 1e-9 for s_start, _ in speech) else 0.0
        if end > start:
            shrunk.append((start, end))
    return shrunk


def words_in_gaps(segments: Sequence[Tuple[float, float, str]], parts: Sequence[Part], margin: float,
                  count_words: Callable[[str], int]) -> Tuple[float, float]:
    """Words a transcript puts in the non-speech stretches, two ways (benchmarks/README.md):
    time share: each segment's words times the share of its time span inside gaps(parts, margin);
    excess: for each segment that overlaps those gaps, its words beyond the reference words of the utterances it
    overlaps (each utterance's words times the share of the utterance the segment covers), at least 0.
    A segment wholly inside a gap counts all its words both ways."""
    gap_list = gaps(parts, margin)
    speech = [(p.start, p.end, count_words(p.text)) for p in parts if p.kind == "speech"]
    time_share = excess = 0.0
    for start, end, text in segments:
        words = count_words(text)
        if not words:
            continue
        if end <= start:
            share = float(any(g_start <= start < g_end for g_start, g_end in gap_list))
        else:
            share = sum(_overlap(start, end, g_start, g_end) for g_start, g_end in gap_list) / (end - start)
        if share == 0:
            continue
        time_share += words * share
        expected = sum(n * _overlap(start, end, s_start, s_end) / (s_end - s_start) for s_start, s_end, n in speech
                       if s_end > s_start)
        excess += max(0.0, words - expected)
    return time_share, excess


def _overlap(start: float, end: float, other_start: float, other_end: float) -> float:
    return max(0.0, min(end, other_end) - max(start, other_start))
