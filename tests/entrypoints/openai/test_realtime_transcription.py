"""Live transcription over /v1/realtime on a real server (Whisper tiny.en): real speech streamed in 100 ms chunks,
faster than real time, through the official openai client's `client.realtime.connect` and plain `websockets`, two
sessions at once (their decodes in the same engine steps); each turn's transcript matches `llm.transcribe` of its
clip and its deltas are a prefix of it; a client that drops mid-turn has its decodes aborted and leaves every block
free, and the server goes on."""
import concurrent.futures
import re
import socket
import threading
import time

import httpx
import numpy as np
import pytest
from conftest import require_model
from realtime_utils import (API_KEY, chunks, clip_path, connect, metric, pause, pcm16, recv, recv_until, send, speech,
                            transcription_update)
from server_utils import SMALL_POOLS, build_engine, running_server, wait_until_idle

from seq2seq_engine import LLM

openai = pytest.importorskip("openai")
pytest.importorskip("websockets")
pytestmark = pytest.mark.usefixtures("one_thread")

MODEL = "whisper-tiny.en"
CLIPS = ("quick_brown_fox", "counting")


@pytest.fixture(scope="module")
def model_dir():
    return require_model(MODEL)


@pytest.fixture(scope="module")
def server(model_dir, one_thread):
    with running_server(build_engine(model_dir, max_num_seqs=8), MODEL, api_key=API_KEY) as running:
        yield running


@pytest.fixture(scope="module")
def expected(texts):
    """llm.transcribe's text of each clip, without case, punctuation and spaces ("1, 2, 345" and "1, 2, 3, 4, 5" are
    the same digits: whether Whisper writes a space between numbers varies with the audio's exact span)."""
    return {name: _words(text) for name, text in texts.items()}


@pytest.fixture(scope="module")
def texts(model_dir):
    """llm.transcribe's text of each clip, greedy as a live turn decodes."""
    llm = LLM(model_dir, max_num_seqs=8, **SMALL_POOLS)
    results = llm.transcribe([clip_path(name) for name in CLIPS], beam_width=1, use_tqdm=False)
    return {name: result.text.strip() for name, result in zip(CLIPS, results)}


def _words(text):
    return re.sub(r"\W", "", text.lower())


def _turns_audio(seed):
    """The clips one after another, each followed by a 1.2 s pause: one turn each for server VAD."""
    return np.concatenate([part for k, name in enumerate(CLIPS) for part in (speech(name), pause(1.2, seed + k))])


def _check_turns(events, expected, names=CLIPS, vad=True):
    """Every turn of `names`, in order: started, stopped, committed, deltas that are a prefix of its transcript,
    and a transcript with the words of llm.transcribe's text."""
    completed = [event for event in events if event["type"].endswith("transcription.completed")]
    assert [_words(event["transcript"]) for event in completed] == [expected[name] for name in names]
    for event in completed:
        item = event["item_id"]
        kinds = [e["type"] for e in events if e.get("item_id") == item]
        heard = ["input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped"] if vad else []
        assert kinds[:len(heard) + 1] == heard + ["input_audio_buffer.committed"]
        deltas = "".join(e["delta"] for e in events if e.get("item_id") == item and e["type"].endswith(".delta"))
        assert event["transcript"].startswith(deltas), (deltas, event["transcript"])
        assert event["usage"]["type"] == "duration" and event["usage"]["seconds"] > 1.0
        assert event["content_index"] == 0 and event["event_id"].startswith("event_")


def _with_openai_client(server):
    """Server VAD at 24 kHz, driven by the official client: every event until the last turn completes."""
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0)
    with client.realtime.connect(extra_query={"intent": "transcription"}) as connection:
        assert connection.recv().type == "session.created"
        connection.session.update(session=transcription_update(24000, language="en")["session"])
        updated = connection.recv()
        assert updated.type == "session.updated" and updated.session.audio.input.format.rate == 24000
        for piece in chunks(pcm16(_turns_audio(1), 24000), 24000):
            connection.input_audio_buffer.append(audio=piece)
        events, completed = [], 0
        while completed < len(CLIPS):
            events.append(connection.recv().model_dump())
            completed += events[-1]["type"].endswith("transcription.completed")
    return events


def _with_defaults(server):
    """Plain websockets, no session.update at all: OpenAI's defaults (24 kHz pcm16, server VAD)."""
    with connect(server) as ws:
        assert recv(ws)["session"]["audio"]["input"]["format"]["rate"] == 24000
        for piece in chunks(pcm16(_turns_audio(7), 24000), 24000):
            send(ws, {"type": "input_audio_buffer.append", "audio": piece})
        events = []
        for _ in CLIPS:
            events += recv_until(ws, "conversation.item.input_audio_transcription.completed")
    return events


def test_two_sessions_at_once_give_llm_transcribes_text(server, expected, monkeypatch):
    before = {name: metric(server, name, MODEL) for name in ("realtime_turns_total", "realtime_audio_seconds_total")}
    engine, batches = server.state.engine, []
    real_step = engine.step

    def step(*args, **kwargs):  # on the loop thread: the sockets whose decodes run in this step
        batches.append({group.request_id.rsplit("-", 2)[0] for group in engine.scheduler.running})
        return real_step(*args, **kwargs)

    monkeypatch.setattr(engine, "step", step)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        runs = [pool.submit(_with_openai_client, server), pool.submit(_with_defaults, server)]
        results = [run.result(timeout=300) for run in runs]
    for events in results:
        assert not [event for event in events if event["type"] == "error"]
        _check_turns(events, expected)
    assert any(len(sockets) == 2 for sockets in batches)  # both sockets' decodes in one step of one batch
    state = wait_until_idle(server)
    assert state["free"] == state["total"] and state["cross_tables"] == 0
    assert metric(server, "realtime_turns_total", MODEL) == before["realtime_turns_total"] + 2 * len(CLIPS)
    streamed = 2 * len(pcm16(_turns_audio(1), 24000)) / 2 / 24000
    assert metric(server, "realtime_audio_seconds_total", MODEL) == pytest.approx(
        before["realtime_audio_seconds_total"] + streamed)


def test_client_commits_without_turn_detection(server, expected, texts):
    with connect(server) as ws:
        recv(ws)
        send(ws, transcription_update(16000, turn_detection=None))
        assert recv(ws)["session"]["audio"]["input"]["turn_detection"] is None
        send(ws, {"type": "input_audio_buffer.commit", "event_id": "c0"})
        empty = recv(ws)
        assert (empty["type"], empty["error"]["code"], empty["error"]["event_id"]) == (
            "error", "input_audio_buffer_commit_empty", "c0")
        send(ws, {"type": "input_audio_buffer.append", "audio": chunks(pcm16(speech("counting")), 16000)[0]})
        send(ws, {"type": "input_audio_buffer.clear"})
        assert recv(ws)["type"] == "input_audio_buffer.cleared"
        events = []
        for name in CLIPS:
            for piece in chunks(pcm16(speech(name)), 16000):
                send(ws, {"type": "input_audio_buffer.append", "audio": piece})
            send(ws, {"type": "input_audio_buffer.commit"})
            events += recv_until(ws, "conversation.item.input_audio_transcription.completed")
    _check_turns(events, expected, vad=False)
    # Without VAD a turn is exactly the clip's audio, decoded as transcribe decodes its one window: the same text.
    assert [e["transcript"] for e in events if e["type"].endswith("completed")] == [texts[n] for n in CLIPS]
    committed = [event for event in events if event["type"] == "input_audio_buffer.committed"]
    assert committed[1]["previous_item_id"] == committed[0]["item_id"]


@pytest.mark.parametrize("abrupt", [False, True], ids=["close-frame", "tcp-drop"])
def test_a_client_that_drops_mid_turn_frees_its_blocks(server, expected, monkeypatch, abrupt):
    loop = server.state.loop
    aborted = []
    real_abort = loop.abort
    monkeypatch.setattr(loop, "abort", lambda *ids: (aborted.extend(ids), real_abort(*ids)))
    gate = threading.Event()
    with connect(server) as ws:
        recv(ws)
        send(ws, transcription_update(16000, turn_detection=None))
        recv(ws)
        for piece in chunks(pcm16(speech("counting")), 16000):
            send(ws, {"type": "input_audio_buffer.append", "audio": piece})
        held = loop.call(lambda engine: gate.wait(60))  # the engine takes no step until the client has gone
        send(ws, {"type": "input_audio_buffer.commit"})
        assert recv(ws)["type"] == "input_audio_buffer.committed"  # its final decode waits in the engine's inbox
        if abrupt:  # no close frame: the connection just ends
            ws.socket.shutdown(socket.SHUT_RDWR)
    deadline = time.monotonic() + 30
    while not aborted and time.monotonic() < deadline:
        time.sleep(0.02)
    gate.set()
    held.result(timeout=30)
    assert len(aborted) == 1 and aborted[0].startswith("live-sess_")
    state = wait_until_idle(server)
    assert state["free"] == state["total"] and state["cross_tables"] == state["self_tables"] == 0
    assert httpx.get(f"{server.url}/health").status_code == 200
    with connect(server) as ws:  # the server goes on
        recv(ws)
        send(ws, transcription_update(16000, turn_detection=None))
        recv(ws)
        for piece in chunks(pcm16(speech("quick_brown_fox")), 16000):
            send(ws, {"type": "input_audio_buffer.append", "audio": piece})
        send(ws, {"type": "input_audio_buffer.commit"})
        events = recv_until(ws, "conversation.item.input_audio_transcription.completed")
    _check_turns(events, expected, ["quick_brown_fox"], vad=False)
