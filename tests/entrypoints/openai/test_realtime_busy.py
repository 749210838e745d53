"""What a realtime socket submits while the engine is busy: final decodes always, interim and speculative decodes
only when nothing but the session's own overtaken decodes (about to be aborted) is in flight, and interim ones within
the engine's budget, shared by its sockets."""
import types

import numpy as np
import pytest
from transcription.live_script import SR, ScriptedVad, TextDecoder, feed, frames

from seq2seq_engine.entrypoints.openai.interim_budget import InterimBudget
from seq2seq_engine.entrypoints.openai.realtime.handler import _call_and_take, _Live
from seq2seq_engine.transcription.live import LiveOptions, LiveSession


def _live(in_flight, state=None):
    vad = ScriptedVad(frames((0.9, 1.5), (0.0, 1.0)))
    session = LiveSession(LiveOptions(interim_interval_s=1.0), TextDecoder(), vad)
    loop = types.SimpleNamespace(requests_in_flight=in_flight)
    return _Live(session, state or types.SimpleNamespace(loop=loop, interim_budget=InterimBudget()), None)


def _append(live, audio, seconds, start):
    return _call_and_take(live, lambda current: feed(current.session, audio, seconds, start))


def test_the_sessions_own_decodes_do_not_make_the_engine_busy_for_it():
    audio = np.random.default_rng(1).uniform(-0.5, 0.5, 3 * SR).astype(np.float32)
    live = _live(in_flight=0)
    _, [interim], stale = _append(live, audio, 1.1, 0.0)
    assert interim.prompt["interim"] and stale == []
    live.state.loop.requests_in_flight = 1  # its own interim decode runs
    _, [speculative], stale = _append(live, audio, 0.6, 1.1)
    assert stale == [] and not speculative.prompt["interim"]


def test_a_busy_engine_gets_no_speculative_decode_but_the_final_one():
    audio = np.random.default_rng(2).uniform(-0.5, 0.5, 3 * SR).astype(np.float32)
    live = _live(in_flight=0)
    _, [interim], _ = _append(live, audio, 1.1, 0.0)
    live.state.loop.requests_in_flight = 2  # the interim decode and another socket's decode run
    _, requests, stale = _append(live, audio, 0.6, 1.1)
    assert requests == [] and stale == []
    _, [final], stale = _append(live, audio, 0.5, 1.7)
    assert not final.prompt["interim"] and stale == [interim.request_id] and len(final.prompt["samples"]) > 2.0 * SR


def test_the_sockets_of_one_engine_share_its_interim_budget():
    audio = np.random.default_rng(3).uniform(-0.5, 0.5, 3 * SR).astype(np.float32)
    state = types.SimpleNamespace(loop=types.SimpleNamespace(requests_in_flight=0),
                                  interim_budget=InterimBudget(period_s=3600.0))
    first, second = _live(0, state), _live(0, state)
    _, [interim], _ = _append(first, audio, 1.1, 0.0)
    assert interim.prompt["interim"]
    _, requests, _ = _append(second, audio, 1.1, 0.0)  # idle engine, but the budget was spent a moment ago
    assert requests == []
    _, [speculative], _ = _append(second, audio, 0.6, 1.1)  # a speculative decode is not an interim one
    assert not speculative.prompt["interim"]
    state.interim_budget = InterimBudget(period_s=0.0)
    third = _live(0, state)
    _, [interim], _ = _append(third, audio, 1.1, 0.0)
    assert interim.prompt["interim"]


def test_the_interim_budget_allows_one_per_period():
    budget = InterimBudget(period_s=0.8)
    assert budget.take(10.0) and not budget.take(10.5) and budget.take(10.8) and not budget.take(11.0)
    with pytest.raises(ValueError, match="period_s"):
        InterimBudget(period_s=-1)
