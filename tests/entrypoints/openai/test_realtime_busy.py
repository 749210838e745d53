"""What a realtime socket submits while the engine is busy: final decodes always, interim and speculative decodes
only when nothing but the session's own overtaken decodes (about to be aborted) is in flight."""
import types

import numpy as np
from transcription.live_script import SR, ScriptedVad, TextDecoder, feed, frames

from seq2seq_engine.entrypoints.openai.realtime_handler import _call_and_take, _Live
from seq2seq_engine.transcription.live import LiveOptions, LiveSession


def _live(in_flight):
    vad = ScriptedVad(frames((0.9, 1.5), (0.0, 1.0)))
    session = LiveSession(LiveOptions(interim_interval_s=1.0), TextDecoder(), vad)
    loop = types.SimpleNamespace(requests_in_flight=in_flight)
    return _Live(session, types.SimpleNamespace(loop=loop), None)


def _append(live, audio, seconds, start):
    return _call_and_take(live, lambda current: feed(current.session, audio, seconds, start))


def test_the_speculative_decode_replaces_the_sessions_own_interim_decode_on_a_busy_engine():
    audio = np.random.default_rng(1).uniform(-0.5, 0.5, 3 * SR).astype(np.float32)
    live = _live(in_flight=0)
    _, [interim], stale = _append(live, audio, 1.1, 0.0)
    assert interim.params is None and stale == []
    live.state.loop.requests_in_flight = 1  # the interim decode runs
    _, [speculative], stale = _append(live, audio, 0.6, 1.1)
    assert stale == [interim.request_id] and not speculative.prompt["interim"]


def test_a_busy_engine_gets_no_speculative_decode_but_the_final_one():
    audio = np.random.default_rng(2).uniform(-0.5, 0.5, 3 * SR).astype(np.float32)
    live = _live(in_flight=0)
    _, [interim], _ = _append(live, audio, 1.1, 0.0)
    live.state.loop.requests_in_flight = 2  # the interim decode and another socket's decode run
    _, requests, stale = _append(live, audio, 0.6, 1.1)
    assert requests == [] and stale == [interim.request_id]
    _, [final], stale = _append(live, audio, 0.5, 1.7)
    assert not final.prompt["interim"] and stale == [] and len(final.prompt["samples"]) > 2.0 * SR
