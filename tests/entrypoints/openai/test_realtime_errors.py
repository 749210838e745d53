"""/v1/realtime refusals on a real server (Whisper tiny.en beside SmolLM2-135M, an API key, a limit of two
sessions), driven by plain `websockets`: a socket without the key is refused at the handshake; a wrong intent, a
model without audio and one session over the limit get an error event and a close code; every bad client event
gets an error event naming its field while the session goes on; /metrics counts the sessions."""
import base64
import json
import time

import numpy as np
import pytest
from conftest import require_model
from realtime_utils import API_KEY, connect, metric, recv, send, transcription_update
from server_utils import build_engine, running_models

websockets = pytest.importorskip("websockets")
pytestmark = pytest.mark.usefixtures("one_thread")

TEXT, AUDIO = "smollm2-135m", "whisper-tiny.en"


@pytest.fixture(scope="module")
def server(one_thread):
    engines = {AUDIO: build_engine(require_model(AUDIO), max_num_seqs=8),
               TEXT: build_engine(require_model(TEXT), max_num_seqs=8)}
    with running_models(engines, api_key=API_KEY, max_realtime_sessions=2) as running:
        yield running


def _closed_after_error(ws, code):
    """The error event the server sends before closing, and the close code it closes with."""
    error = recv(ws)
    with pytest.raises(websockets.exceptions.ConnectionClosed) as closed:
        recv(ws, timeout=30)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == code
    assert error["type"] == "error" and error["event_id"].startswith("event_")
    return error["error"]


@pytest.mark.parametrize("key", [None, "wrong-key"])
def test_a_socket_without_the_key_is_refused_at_the_handshake(server, key):
    with pytest.raises(websockets.exceptions.InvalidStatus) as refused:
        connect(server, key=key)
    assert refused.value.response.status_code == 403


@pytest.mark.parametrize("query", ["", "intent=conversation", "model=whisper-tiny.en"])
def test_only_transcription_intent_is_served(server, query):
    with connect(server, query) as ws:
        error = _closed_after_error(ws, 1008)
    assert (error["code"], error["param"]) == ("invalid_intent", "intent")


def test_a_model_without_audio_gets_an_error_and_close(server):
    with connect(server, f"intent=transcription&model={TEXT}") as ws:
        error = _closed_after_error(ws, 1008)
    assert error["code"] == "model_not_supported" and TEXT in error["message"]
    with connect(server) as ws:
        assert recv(ws)["session"]["audio"]["input"]["transcription"]["model"] == AUDIO
        send(ws, {**transcription_update(model=TEXT), "event_id": "u9"})
        error = _closed_after_error(ws, 1008)
    assert (error["code"], error["param"], error["event_id"]) == (
        "model_not_supported", "session.audio.input.transcription.model", "u9")


def _bad_events():
    odd = base64.b64encode(np.random.default_rng(1).integers(-900, 900, 7, dtype="<i2").tobytes()[:13]).decode()
    update = transcription_update()
    return [
        ("{no json", "invalid_json", None),
        (b"\x01\x02", "invalid_json", None),
        ({"type": "response.create"}, "invalid_event_type", "type"),
        ({"type": "input_audio_buffer.append", "audio": "***"}, "invalid_base64", "audio"),
        ({"type": "input_audio_buffer.append", "audio": odd}, "invalid_audio", "audio"),
        ({**update, "session": {"audio": {"input": {"format": {"type": "audio/pcm", "rate": 8000}}}}},
         "invalid_value", "session.audio.input.format.rate"),
        ({**update, "session": {"audio": {"input": {"format": {"type": "audio/pcma"}}}}}, "invalid_value",
         "session.audio.input.format.type"),
        ({**update, "session": {"audio": {"input": {"turn_detection": {"type": "semantic_vad"}}}}},
         "invalid_value", "session.audio.input.turn_detection.type"),
        (transcription_update(model="gpt-4o-transcribe"), "model_not_found",
         "session.audio.input.transcription.model"),
        (transcription_update(language="fr"), "invalid_value", "session.audio.input.transcription.language"),
        ({"type": "input_audio_buffer.append", "audio": base64.b64encode(bytes(24000 * 2 * 61)).decode()},
         "invalid_value", "audio"),  # one append of more than the 60 s a session holds
        (transcription_update(prompt="word " * 7000), "string_above_max_length",
         "session.audio.input.transcription.prompt"),  # 35,000 characters: over the 32,768 a prompt may have
        (transcription_update(language="e" * 300), "string_above_max_length",
         "session.audio.input.transcription.language"),
    ]


def test_each_bad_event_gets_an_error_and_the_session_goes_on(server):
    with connect(server) as ws:
        created = recv(ws)
        assert created["type"] == "session.created" and created["session"]["type"] == "transcription"
        for number, (event, code, param) in enumerate(_bad_events()):
            if isinstance(event, dict):
                event = json.dumps({**event, "event_id": f"bad{number}"})
            ws.send(event)
            reply = recv(ws)
            assert reply["type"] == "error", (event, reply)
            assert (reply["error"]["code"], reply["error"]["param"]) == (code, param), reply
            assert reply["error"]["event_id"] == (f"bad{number}" if param else None)
        send(ws, transcription_update(rate=24000, turn_detection=None, language="en"))
        updated = recv(ws)
    assert updated["type"] == "session.updated"
    audio = updated["session"]["audio"]["input"]
    assert audio["format"]["rate"] == 24000 and audio["turn_detection"] is None
    assert audio["transcription"]["language"] == "en" and updated["session"]["id"] == created["session"]["id"]


def test_a_long_event_id_is_refused_and_a_message_over_the_size_limit_closes_the_socket(server):
    with connect(server) as ws:
        recv(ws)
        send(ws, {"type": "input_audio_buffer.clear", "event_id": "e" * 257})
        error = recv(ws)["error"]
        assert (error["code"], error["param"], error["event_id"]) == ("string_above_max_length", "event_id", None)
        send(ws, transcription_update(prompt="a prompt of the limit's length".ljust(4096, "."), language="en"))
        assert recv(ws)["session"]["audio"]["input"]["transcription"]["prompt"].endswith("....")
        send(ws, {"type": "input_audio_buffer.append", "audio": "A" * (4 * 1024 * 1024)})  # 4 MiB + the JSON
        with pytest.raises(websockets.exceptions.ConnectionClosed) as closed:
            recv(ws, timeout=30)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009  # message too big


def _metric(server, name):
    return metric(server, name, AUDIO)


def test_sessions_over_the_limit_are_refused_and_counted(server):
    opened = _metric(server, "realtime_sessions_opened_total")
    with connect(server) as first, connect(server) as second:
        assert recv(first)["type"] == recv(second)["type"] == "session.created"
        assert _metric(server, "realtime_sessions") == 2
        with connect(server) as third:
            error = _closed_after_error(third, 1013)
        assert error["code"] == "session_limit_reached" and "2" in error["message"]
    deadline = time.monotonic() + 30
    while _metric(server, "realtime_sessions") and time.monotonic() < deadline:  # the server sees the closes
        time.sleep(0.05)
    with connect(server) as again:  # the closed sockets gave their places back
        assert recv(again)["type"] == "session.created"
    assert _metric(server, "realtime_sessions_opened_total") == opened + 3
    assert _metric(server, "realtime_sessions") == 0
