"""LiveSession's bounds with a scripted VAD and a stand-in decoder: at most max_decodes_in_flight final decodes
handed out (the others queued, in order), `backlogged` while final work waits, an append refused beyond
max_buffered_s when the owner ignores it, a long commit-mode turn decoded in parts of at most 30 s cut at a pause
(never one-second turns), and random event sequences (hypothesis) that keep every bound and end with nothing
pending."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from transcription.live_script import SR, ScriptedVad, TextDecoder, answer, feed, frames

from seq2seq_engine.transcription.live import Committed, Completed, LiveOptions, LiveSession
from seq2seq_engine.transcription.live.audio_buffer import AudioBacklog, AudioBuffer, quiet_cut


def _speech_like(seconds, pauses, seed=0):
    """Loud noise with 300 ms of near silence starting at each of `pauses` (seconds)."""
    audio = np.random.default_rng(seed).uniform(-0.5, 0.5, int(seconds * SR)).astype(np.float32)
    for at in pauses:
        audio[int(at * SR):int((at + 0.3) * SR)] *= 0.001
    return audio


def test_a_window_is_cut_in_its_last_pause_else_at_its_end():
    window = _speech_like(30, [12.0, 27.2])
    assert 27.2 * SR <= quiet_cut(window) <= 27.5 * SR  # the pause of the last 5 s, not the earlier one
    assert quiet_cut(_speech_like(30, [12.0])) == 30 * SR  # no pause near the end: a full window
    assert quiet_cut(np.zeros(30 * SR, dtype=np.float32)) == 30 * SR  # silence throughout: nothing to prefer


def test_the_buffer_cuts_a_held_window_where_the_whole_window_is_cut():
    buffer = AudioBuffer()
    buffer.append(np.zeros(3 * SR, np.float32))
    buffer.drop_before(2 * SR)  # stream indices are not array indices
    for seed, pauses in enumerate(([12.0, 27.2], [12.0], [29.7], [25.0])):
        window = _speech_like(30, pauses, seed)
        start = buffer.end
        buffer.append(window)
        assert buffer.quiet_cut(start, start + 30 * SR) == start + quiet_cut(window), pauses


def test_a_long_commit_mode_turn_fed_as_fast_as_allowed_is_one_item_of_parts_cut_at_pauses():
    audio = _speech_like(154, [27.0, 55.5, 84.0, 113.1, 141.0])
    session = LiveSession(LiveOptions(turn_detection=None), TextDecoder())
    handed, events, most_in_flight = [], [], 0
    for second in range(154):
        while session.backlogged:  # the owner waits for an output before it reads more
            handed += session.take_requests()
            events += answer(session, handed.pop(0), "words")
        events += session.append(audio[second * SR:(second + 1) * SR])
        handed += session.take_requests()
        most_in_flight = max(most_in_flight, len(handed))
    events += session.commit()
    handed += session.take_requests()
    while handed:
        events += answer(session, handed.pop(0), "words")
        handed += session.take_requests()
    assert [type(e) for e in events].count(Committed) == 1
    [completed] = [e for e in events if isinstance(e, Completed)]
    assert completed.audio_seconds == pytest.approx(154.0) and completed.transcript == " ".join(["words"] * 6)
    assert most_in_flight == 1


def test_parts_are_cut_at_the_pauses():
    audio = _speech_like(70, [27.0, 55.5])
    session = LiveSession(LiveOptions(turn_detection=None), TextDecoder())
    feed(session, audio, 70.0, chunk=SR)
    [first] = session.take_requests()
    assert 27.0 * SR < len(first.prompt["samples"]) < 27.3 * SR
    assert session.backlogged  # the second part waits for the first one's text
    answer(session, first, "one")
    [second] = session.take_requests()
    assert 55.5 * SR < len(first.prompt["samples"]) + len(second.prompt["samples"]) < 55.8 * SR


def test_an_owner_that_ignores_the_backlog_gets_an_error_not_one_second_turns():
    session = LiveSession(LiveOptions(turn_detection=None, max_buffered_s=40.0), TextDecoder())
    audio = _speech_like(120, [])
    with pytest.raises(AudioBacklog, match="max_buffered_s=40") as refused:
        for second in range(120):
            session.append(audio[second * SR:(second + 1) * SR])
    assert refused.value.limit_s == 40.0 and 40.0 < refused.value.held_s <= 41.0
    assert len(session.take_requests()) == 1  # the first window; no turn was committed early
    assert isinstance(refused.value, ValueError)


def test_final_decodes_of_many_turns_run_one_at_a_time_in_order():
    script = frames(*[(0.9, 0.6), (0.0, 0.7)] * 6)
    session = LiveSession(LiveOptions(interim_interval_s=30.0, speculative_silence_ms=None), TextDecoder(),
                          ScriptedVad(script))
    events = feed(session, np.zeros(8 * SR, dtype=np.float32), 8.0)
    assert [type(e) for e in events].count(Committed) == 6
    order = []
    while session.pending_request_ids() or session.backlogged:
        [request] = session.take_requests()
        order.append(request.request_id)
        events += answer(session, request, f"turn{len(order)}")
    assert [e.transcript for e in events if isinstance(e, Completed)] == [f"turn{k}" for k in range(1, 7)]
    assert order == sorted(order, key=lambda rid: int(rid.rsplit("-", 1)[1]))


EVENT = st.one_of(st.tuples(st.just("append"), st.floats(0.01, 12.0)), st.tuples(st.just("commit"), st.just(0)),
                  st.tuples(st.just("clear"), st.just(0)), st.tuples(st.just("answer"), st.integers(0, 3)))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(EVENT, max_size=40), st.integers(1, 3), st.booleans(), st.integers(0, 10 ** 6))
def test_random_event_sequences_keep_the_bounds(script, in_flight, vad, seed):
    rng = np.random.default_rng(seed)
    options = LiveOptions(turn_detection=None, max_buffered_s=20.0, max_decodes_in_flight=in_flight,
                          speculative_silence_ms=None) if not vad else \
        LiveOptions(max_buffered_s=20.0, max_decodes_in_flight=in_flight)
    probabilities = rng.choice([0.05, 0.95], size=4000, p=[0.4, 0.6]).repeat(8)
    session = LiveSession(options, TextDecoder(), ScriptedVad(probabilities.tolist()) if vad else None)
    handed = []
    for kind, value in script:
        if kind == "append" and not session.backlogged:
            session.append(rng.uniform(-0.5, 0.5, int(value * SR)).astype(np.float32))
        elif kind == "commit" and session.buffered_seconds > 0.2:
            try:
                session.commit()
            except ValueError:
                pass  # under 100 ms uncommitted, or no speech heard
        elif kind == "clear":
            session.clear()
        elif kind == "answer" and handed:
            request = handed.pop(min(value, len(handed) - 1))
            answer(session, request, "x")
        handed += session.take_requests(interim=bool(rng.integers(2)))
        stale = set(session.take_stale())  # the owner aborts these: their outputs never come
        handed = [r for r in handed if r.request_id not in stale]
        finals = [r for r in handed if not r.prompt["interim"]]
        assert len(finals) <= in_flight + 1  # + an adopted speculative decode
        assert session.buffered_seconds <= 20.0 + 12.0 + 30.5  # the bound, one append, the window being cut
    while handed:
        answer(session, handed.pop(0), "x")
        handed += session.take_requests()
        stale = set(session.take_stale())
        handed = [r for r in handed if r.request_id not in stale]
    assert session.pending_request_ids() == [] and not session.backlogged
