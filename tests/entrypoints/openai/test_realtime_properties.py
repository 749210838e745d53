"""A realtime socket's handler driven by random client event sequences (hypothesis): session updates (server VAD or
commits, 16 or 24 kHz), appends of random sizes of real speech or quiet noise at random paces, commits and clears,
read as the route reads them (waiting for room before each event) while its pump feeds back the real engine's
outputs (Whisper tiny.en on the server's engine loop). After every event the session's final decodes in flight,
the engine's requests and the audio it holds stay within their bounds; when the socket closes every KV block is
free again (whether the client waited for its transcripts or left at once) and the process's memory has not grown
with the audio sent."""
import asyncio
import base64
import json
import resource

import numpy as np
import pytest
from conftest import require_model
from hypothesis import HealthCheck, example, given, settings, strategies as st
from realtime_utils import API_KEY, pause, pcm16, speech, transcription_update
from server_utils import build_engine, running_server, wait_until_idle

from seq2seq_engine.entrypoints.openai.realtime.handler import CloseSocket, RealtimeTranscription
from seq2seq_engine.entrypoints.openai.realtime.sessions import LiveSessions
from seq2seq_engine.transcription.live import LiveOptions

pytestmark = pytest.mark.usefixtures("one_thread")
MODEL = "whisper-tiny.en"
LIMITS = LiveOptions()


@pytest.fixture(scope="module")
def server(one_thread):
    with running_server(build_engine(require_model(MODEL), max_num_seqs=8), MODEL, api_key=API_KEY) as running:
        yield running


@pytest.fixture(scope="module")
def sources():
    talk = np.concatenate([speech("quick_brown_fox"), pause(0.6, 1), speech("counting"), pause(0.8, 2)])
    return {"speech": talk, "quiet": pause(8.0, 3)}


APPEND = st.tuples(st.just("append"), st.sampled_from(["speech", "quiet"]), st.floats(0.02, 6.0), st.floats(0, 0.05))
EVENTS = st.lists(st.one_of(
    APPEND, APPEND, APPEND,
    st.tuples(st.just("update"), st.sampled_from(["server_vad", None]), st.sampled_from([16000, 24000]),
              st.just(0.0)),
    st.tuples(st.just("commit"), st.just(""), st.just(0.0), st.floats(0, 0.05)),
    st.tuples(st.just("clear"), st.just(""), st.just(0.0), st.just(0.0))), min_size=1, max_size=16)


def _event(step, source, rate):
    """The client event of an append, commit or clear step."""
    kind, what, amount, _ = step
    if kind == "append":
        samples = np.resize(source[what], int(amount * 16000))
        return {"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm16(samples, rate)).decode()}
    return {"type": f"input_audio_buffer.{kind}"}


async def _drain(handler, timeout=120.0):
    """Wait until the session's decodes have all come back (a client that stays until its transcripts arrive)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while handler.live is not None and handler.live.session.pending_request_ids():
        assert loop.time() < deadline, "the session's decodes did not finish"
        await asyncio.sleep(0.05)


async def _drive(server, steps, sources, drain):
    async def send(event):
        assert event["type"] != "error" or event["error"]["code"] == "input_audio_buffer_commit_empty", event

    handler = RealtimeTranscription(server.models, server.state, send, LiveSessions(), LIMITS.max_buffered_s)
    pump = asyncio.ensure_future(handler.pump())
    rate, most_in_flight = 24000, 0
    try:
        for step in steps:
            await handler.wait_for_room()  # as the route's reader does before each receive
            if step[0] == "update":
                rate = step[2]
                event = transcription_update(rate, turn_detection=step[1], language="en")
            else:
                event = _event(step, sources, rate)
            await handler.handle(json.dumps(event))
            await asyncio.sleep(step[3])
            live = handler.live.session if handler.live is not None else None
            if live is not None:
                # one final decode, an interim and a speculative one
                assert len(live.pending_request_ids()) <= LIMITS.max_decodes_in_flight + 2
                assert live.buffered_seconds <= LIMITS.max_buffered_s + 6.0
            most_in_flight = max(most_in_flight, server.state.loop.requests_in_flight)
        if drain:  # the client commits what it sent and waits for its transcripts
            await handler.wait_for_room()
            await handler.handle(json.dumps({"type": "input_audio_buffer.commit"}))
            await _drain(handler)
    except CloseSocket as closed:  # never for these events
        raise AssertionError(f"the socket was closed with {closed.code}")
    finally:
        pump.cancel()
        await asyncio.gather(pump, return_exceptions=True)
        handler.close()
    assert most_in_flight <= LIMITS.max_decodes_in_flight + 2  # a final, an interim and a speculative decode


@settings(max_examples=20, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@example(steps=[("update", "server_vad", 24000, 0.0)] + [("append", "speech", 6.0, 0.0)] * 4
         + [("append", "quiet", 3.0, 0.0), ("update", None, 16000, 0.0)] + [("append", "speech", 6.0, 0.0)] * 8
         + [("commit", "", 0.0, 0.0)], drain=True)
@example(steps=[("update", None, 24000, 0.0)] + [("append", "speech", 6.0, 0.0)] * 12, drain=False)
@given(steps=EVENTS, drain=st.booleans())
def test_random_event_sequences_stay_bounded_and_free_every_block(server, sources, steps, drain):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    asyncio.run(_drive(server, steps, sources, drain))
    state = wait_until_idle(server)
    assert state["free"] == state["total"] and state["cross_tables"] == state["self_tables"] == 0
    assert (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024 < 400
