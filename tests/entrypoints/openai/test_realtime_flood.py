"""Clients that send audio faster than real time, on a real server (Whisper tiny.en): a commit-mode flood is held
back by its socket (the server reads no further event while the session has a final decode waiting), keeps at most
one final decode in the engine, is one item cut into windows at most 30 s long (never one-second turns), and delays
another client's turn, driven by the official openai client, by at most about one decode; a server-VAD flood of
many turns keeps one final decode in flight and completes every turn in order. /metrics is sampled throughout."""
import re
import resource
import threading
import time

import numpy as np
import pytest
from conftest import require_model
from realtime_utils import (API_KEY, chunks, connect, metric, pause, pcm16, recv, recv_until, send, speech,
                            transcription_update)
from server_utils import build_engine, running_server, wait_until_idle

openai = pytest.importorskip("openai")
pytest.importorskip("websockets")
pytestmark = pytest.mark.usefixtures("one_thread")

MODEL = "whisper-tiny.en"
COMPLETED = "conversation.item.input_audio_transcription.completed"


@pytest.fixture(scope="module")
def server(one_thread):
    with running_server(build_engine(require_model(MODEL), max_num_seqs=8), MODEL, api_key=API_KEY) as running:
        yield running


class Sampler:
    """Polls /metrics while running: the most requests the engine held at once (running + waiting)."""

    def __init__(self, server):
        self.server, self.most, self._stop = server, 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            held = sum(metric(self.server, name, MODEL) for name in ("num_requests_running", "num_requests_waiting"))
            self.most = max(self.most, int(held))
            time.sleep(0.05)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(10)


def _speech_seconds(seconds, seed):
    """Real speech of at least `seconds` (three clips with short pauses, repeated) and how often the fox is in it."""
    parts, total, cycles = [], 0, 0
    while total < seconds * 16000:
        for k, name in enumerate(("quick_brown_fox", "counting", "hello_world")):
            parts += [speech(name), pause(0.25, seed + 3 * cycles + k)]
            total += len(parts[-2]) + len(parts[-1])
        cycles += 1
    return np.concatenate(parts), cycles


def _turn_latency(server, audio):
    """Seconds from a commit-mode turn's commit to its completed transcript, with the official openai client."""
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0)
    with client.realtime.connect(extra_query={"intent": "transcription"}) as connection:
        assert connection.recv().type == "session.created"
        update = transcription_update(24000, turn_detection=None, language="en")["session"]
        connection.session.update(session=update)
        assert connection.recv().type == "session.updated"
        for piece in chunks(pcm16(audio, 24000), 24000, seconds=0.5):
            connection.input_audio_buffer.append(audio=piece)
        start = time.monotonic()
        connection.input_audio_buffer.commit()
        while (event := connection.recv()).type != COMPLETED:
            pass
        return time.monotonic() - start, event.transcript


def _flood(server, audio, update, out):
    """Send `audio` in 1 s appends as fast as the socket takes them, commit, then read every event until the
    completed transcript of each committed item arrives."""
    with connect(server) as ws:
        recv(ws)
        send(ws, update)
        recv(ws)
        for piece in chunks(pcm16(audio), 16000, seconds=1.0):
            send(ws, {"type": "input_audio_buffer.append", "audio": piece})
        if update["session"]["audio"]["input"]["turn_detection"] is None:
            send(ws, {"type": "input_audio_buffer.commit"})
        events = recv_until(ws, "input_audio_buffer.committed")
        while sum(e["type"] == COMPLETED for e in events) < sum(e["type"].endswith("committed") for e in events):
            events.append(recv(ws, timeout=120))
        out["events"] = events


def _rss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def test_a_commit_mode_flood_is_held_back_and_delays_another_turn_by_about_one_decode(server):
    turn = np.concatenate([speech("quick_brown_fox"), pause(0.3, 1)])
    window = _speech_seconds(29, 2)[0][:29 * 16000]
    alone = min(_turn_latency(server, turn)[0] for _ in range(2))
    window_alone, _ = _turn_latency(server, window)
    (flood, foxes), out, peak_before = _speech_seconds(125, 3), {}, _rss_mb()
    update = transcription_update(16000, turn_detection=None, language="en")
    with Sampler(server) as sampler:
        flooder = threading.Thread(target=_flood, args=(server, flood, update, out))
        flooder.start()
        time.sleep(2.0)
        during, text = _turn_latency(server, turn)
        flooder.join(300)
    assert not flooder.is_alive()
    assert sampler.most <= 2, sampler.most  # the flood's one final decode and the other client's
    assert during <= 1.5 * (alone + window_alone) + 1.0, (during, alone, window_alone)
    assert "fox" in text.lower()
    committed = [e for e in out["events"] if e["type"] == "input_audio_buffer.committed"]
    [completed] = [e for e in out["events"] if e["type"] == COMPLETED]
    assert len(committed) == 1 and completed["usage"]["seconds"] > 120
    spoken = len(re.findall(r"\bfox\b", completed["transcript"].lower()))
    assert spoken >= foxes - 2, (spoken, foxes)  # every window transcribed (a word at a cut may go)
    assert _rss_mb() - peak_before < 500
    state = wait_until_idle(server)
    assert state["free"] == state["total"]


def test_a_server_vad_flood_of_many_turns_keeps_one_final_decode_in_flight(server):
    speech_turns = np.concatenate([part for k in range(8) for part in
                                   (speech(("quick_brown_fox", "counting")[k % 2]), pause(1.2, 10 + k))])
    out = {}
    with Sampler(server) as sampler:
        _flood(server, speech_turns, transcription_update(16000, language="en"), out)
    completed = [e for e in out["events"] if e["type"] == COMPLETED]
    assert len(completed) == 8
    assert ["fox" in e["transcript"].lower() for e in completed] == [k % 2 == 0 for k in range(8)]
    # one final decode, and an interim or speculative one only while the engine runs nothing else
    assert sampler.most <= 2, sampler.most
    state = wait_until_idle(server)
    assert state["free"] == state["total"]
