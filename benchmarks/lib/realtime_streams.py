"""The live streams of realtime_load.py: recordings of turns between 1-2 s pauses, the turns the server's VAD rule
finds in them (offline, for the peer), and each spoken turn's latency, first-text delay and WER."""
from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Optional, Sequence, Tuple

import jiwer
import numpy as np

from benchmarks.lib import long_audio
from benchmarks.lib.long_audio import Recording
from benchmarks.lib.wer import normalize
from seq2seq_engine.audio import SAMPLE_RATE
from seq2seq_engine.transcription.live import DecodeRequest, LiveOptions, LiveSession, StreamingVad, TurnDetection


def build_streams(count: int, seconds: float, seed: int, max_turns: Optional[int] = None,
                  espeak: bool = True) -> List[Recording]:
    """`count` recordings of about `seconds` (or of `max_turns` turns): a 0.5-1.5 s pause, then utterances (the
    pytest-audioeval clips and, with espeak-ng, its spoken sentences) in a random order, each followed by a pause of
    1-2 s of quiet room noise; a low noise floor under everything. Each stream has its own order and levels."""
    rng = np.random.default_rng(seed)
    if espeak:
        pool = long_audio.utterance_pool(rng)
    else:
        pool = [(long_audio.trim(samples), text) for samples, text in long_audio.audioeval_clips()]
    if not pool:
        raise SystemExit("no speech to stream: install pytest-audioeval (pip install --no-deps pytest-audioeval) "
                         "and/or espeak-ng")
    return [_compose(f"stream{i + 1}", pool, seconds, np.random.default_rng([seed, i]), max_turns)
            for i in range(count)]


def _compose(name: str, pool: Sequence[Tuple[np.ndarray, str]], seconds: float, rng: np.random.Generator,
             max_turns: Optional[int]) -> Recording:
    recording = long_audio.RecordingBuilder()
    recording.add("silence", long_audio.gap_audio("silence", rng.uniform(0.5, 1.5), rng))
    order = rng.permutation(len(pool))
    turns = 0
    while (max_turns is None or turns < max_turns) and (turns == 0 or recording.position < seconds * SAMPLE_RATE):
        samples, text = pool[order[turns % len(order)]]
        recording.add("speech", samples * rng.uniform(0.6, 1.0), text)
        recording.add("silence", long_audio.gap_audio("silence", rng.uniform(1.0, 2.0), rng))
        turns += 1
    return recording.build(name, rng)


def chunks_of(samples: np.ndarray, chunk_s: float) -> List[np.ndarray]:
    size = int(round(chunk_s * SAMPLE_RATE))
    return [samples[at:at + size] for at in range(0, len(samples), size)]


def pcm16(samples: np.ndarray) -> bytes:
    """float32 16 kHz samples as pcm16 little-endian (what a client sends)."""
    return (np.clip(samples, -1.0, 1.0) * 32767).round().astype("<i2").tobytes()


class _SpanDecoder:
    """A LiveDecoder stand-in that hands back the samples of each decode instead of an engine request."""

    needs_language = False

    def check_language(self, language: Optional[str]) -> Optional[str]:
        return language

    def request(self, request_id: str, samples: np.ndarray, language: Optional[str], prompt_text: Optional[str],
                interim: bool = False, prefix_text: Optional[str] = None) -> DecodeRequest:
        return DecodeRequest(request_id, {"samples": samples}, {"interim": interim})


@dataclasses.dataclass
class VadTurn:
    """A turn the VAD rule cut: its audio, where it lies in the stream (s), and the chunk whose arrival ends it."""

    start: float
    end: float
    chunk: int
    samples: np.ndarray


def vad_turns(recording: Recording, chunk_s: float, detection: TurnDetection) -> List[VadTurn]:
    """The turns the server finds in the stream sent in `chunk_s` chunks: the same LiveSession turn logic and
    streaming Silero VAD, run offline; each turn's samples are exactly what the server's final decode reads."""
    # the peer decodes each turn once the VAD ends it (no speculative decode: that is the server's own feature);
    # nothing is decoded here, so every turn's decode is handed out at once (the most a session allows)
    options = LiveOptions(language="en", turn_detection=detection, speculative_silence_ms=None,
                          max_decodes_in_flight=64)
    session = LiveSession(options, _SpanDecoder(), StreamingVad())
    turns, started = [], 0.0
    for k, chunk in enumerate(chunks_of(recording.samples, chunk_s)):
        for event in session.append(chunk):
            if hasattr(event, "audio_start_ms"):
                started = event.audio_start_ms / 1000
        for request in session.take_requests():
            if not request.params["interim"]:
                samples = request.prompt["samples"]
                turns.append(VadTurn(started, started + len(samples) / SAMPLE_RATE, k, samples))
    return turns


def _words(text: str) -> str:
    """Whisper's normalised words with each run of numbers joined: "One two three" normalises to "123" but
    "1-2-3" and "1, 2, 3" to "one 2 3" (a lone 1 becomes "one"), which are the same words heard."""
    words: List[str] = []
    for word in ("1" if w == "one" else w for w in normalize(text)):
        if word.isdigit() and words and words[-1].isdigit():
            words[-1] += word
        else:
            words.append(word)
    return " ".join(words)


def turn_wer(pairs: Sequence[Tuple[str, str]]) -> float:
    """Errors / reference words over (reference, transcript) pairs, words as `_words` gives them."""
    pairs = list(pairs)
    return jiwer.wer([_words(r) for r, _ in pairs], [_words(h) for _, h in pairs]) if pairs else 0.0


def _overlap(a: Tuple[float, float], b: Tuple[float, float]) -> float:
    return max(0.0, min(a[1], b[1]) - max(a[0], b[0]))


def score_stream(recording: Recording, items: List[Dict[str, Any]], pace: float) -> Tuple[List[Dict[str, Any]], int]:
    """Per spoken turn (utterance) of the stream: its transcript (the texts of the VAD items that overlap it most,
    in order), latency = arrival of the last of those items' transcripts - the utterance's end (stream time / pace),
    first text = the first delta (or transcript) of its items - the utterance's start, and WER. `items`: dicts of
    start, end (stream seconds), first, done (seconds since the stream's first chunk was due), text. Also the count
    of items with text that overlap no utterance."""
    spoken = [p for p in recording.parts if p.kind == "speech"]
    mine: List[List[Dict[str, Any]]] = [[] for _ in spoken]
    stray = 0
    for item in sorted(items, key=lambda i: i["start"]):
        overlaps = [_overlap((item["start"], item["end"]), (p.start, p.end)) for p in spoken]
        if spoken and max(overlaps) > 0:
            mine[int(np.argmax(overlaps))].append(item)
        elif item["text"].strip():
            stray += 1
    rows = []
    for index, (part, assigned) in enumerate(zip(spoken, mine)):
        text = " ".join(i["text"].strip() for i in assigned if i["text"].strip())
        done = [i["done"] for i in assigned if i["done"] is not None]
        first = [i["first"] for i in assigned if i["first"] is not None]
        complete = bool(assigned) and len(done) == len(assigned)
        rows.append({"stream": recording.name, "turn": index, "start": part.start, "end": part.end,
                     "reference": part.text, "transcript": text,
                     "latency": max(done) - part.end / pace if complete else None,
                     "first_text": min(first) - part.start / pace if first else None,
                     "wer": turn_wer([(part.text, text)])})
    return rows, stray


def summarize(rows: List[Dict[str, Any]], stray: int) -> Dict[str, Any]:
    """Percentiles (numpy's linear interpolation) of the latency and first-text delay, the turns missed (no
    transcript arrived), WER over all the turns (a missed turn's transcript is empty)."""
    def pct(key: str, q: float) -> Optional[float]:
        values = [r[key] for r in rows if r[key] is not None]
        return float(np.percentile(values, q)) if values else None
    return {"turns": len(rows), "missed": sum(r["latency"] is None for r in rows), "stray_items": stray,
            "latency_p50": pct("latency", 50), "latency_p95": pct("latency", 95),
            "first_text_p50": pct("first_text", 50), "first_text_p95": pct("first_text", 95),
            "wer": turn_wer([(r["reference"], r["transcript"]) for r in rows])}
