"""LiveSession's speculative final decodes with a scripted VAD and a stand-in decoder: a decode started early in a
silence completes the turn when the silence ends it, speech again withdraws it, a busy owner drops it, and it
overtakes the turn's interim decode (the owner aborts that one)."""
import numpy as np
import pytest
from transcription.live_script import FRAME, SR, ScriptedVad, TextDecoder, answer, feed, frames

from seq2seq_engine.transcription.live import (Committed, Completed, Delta, LiveOptions, LiveSession, SpeechStarted,
                                               SpeechStopped)


@pytest.fixture()
def audio():
    return np.random.default_rng(0).uniform(-0.5, 0.5, 80 * SR).astype(np.float32)


def _spoken_turn(audio, silence_seconds, **options):
    """A session whose scripted VAD hears 2 s of speech, then `silence_seconds` of silence, fed to the end."""
    vad = ScriptedVad(frames((0.9, 2.0), (0.0, silence_seconds)))
    session = LiveSession(LiveOptions(interim_interval_s=30.0, **options), TextDecoder(), vad)
    return session, feed(session, audio, 2.0 + silence_seconds)


def test_a_speculative_decode_that_finishes_before_the_turn_ends_completes_it_at_the_commit(audio):
    session, events = _spoken_turn(audio, 0.3)  # 300 ms of silence: past 160 ms, before 500 ms
    assert not any(isinstance(e, Committed) for e in events)
    [speculative] = session.take_requests()
    speech_end = round(2.0 * SR / FRAME) * FRAME
    assert not speculative.prompt["interim"] and speculative.prompt["prefix_text"] is None
    # it covers the speech and the first 160 ms of silence (whole VAD frames)
    assert speech_end + 160 * 16 <= len(speculative.prompt["samples"]) <= speech_end + 160 * 16 + FRAME
    assert answer(session, speculative, "Hello there.") == []  # kept until the turn ends
    events = feed(session, audio, 0.5, start=2.3)
    item = events[0].item_id
    assert [type(e) for e in events] == [SpeechStopped, Committed, Delta, Completed]
    assert events[-1] == Completed(item, "Hello there.", events[-1].audio_seconds)
    assert session.take_requests() == [] and session.pending_request_ids() == []


def test_a_speculative_decode_still_running_at_the_commit_becomes_the_final_decode(audio):
    session, events = _spoken_turn(audio, 1.0)
    [speculative] = session.take_requests()
    assert [type(e) for e in events] == [SpeechStarted, SpeechStopped, Committed]
    assert session.take_requests() == []  # no second decode of the turn
    assert session.pending_request_ids() == [speculative.request_id]
    events = answer(session, speculative, "Hello there.")
    assert [type(e) for e in events] == [Delta, Completed] and events[-1].transcript == "Hello there."


def test_speech_after_a_short_pause_drops_the_speculative_decode(audio):
    vad = ScriptedVad(frames((0.9, 1.0), (0.0, 0.3), (0.9, 1.0), (0.0, 1.0)))
    session = LiveSession(LiveOptions(interim_interval_s=30.0), TextDecoder(), vad)
    feed(session, audio, 1.3)
    [stale] = session.take_requests()
    assert session.take_stale() == []
    feed(session, audio, 2.0, start=1.3)
    assert session.take_stale() == [stale.request_id] and session.take_stale() == []  # the owner aborts it
    [fresh] = session.take_requests()
    assert len(fresh.prompt["samples"]) > len(stale.prompt["samples"]) + 0.9 * SR
    assert session.pending_request_ids() == [fresh.request_id]
    with pytest.raises(ValueError, match="request_id"):
        answer(session, stale, "Hello")  # aborted: its output is not the session's any more
    events = answer(session, fresh, "Hello there, friend.")
    assert events[-1].transcript == "Hello there, friend." and session.pending_request_ids() == []


def test_a_busy_owner_drops_the_speculative_decode_and_the_commit_decodes_the_turn(audio):
    session, _ = _spoken_turn(audio, 0.3)
    assert session.take_requests(interim=False) == []
    events = feed(session, audio, 0.5, start=2.3)
    assert [type(e) for e in events] == [SpeechStopped, Committed]
    [final] = session.take_requests(interim=False)  # a final decode is never dropped
    assert len(final.prompt["samples"]) > 2.4 * SR
    assert answer(session, final, "Hello there.")[-1].transcript == "Hello there."


def test_a_speculative_decode_not_yet_submitted_is_withdrawn_when_speech_resumes(audio):
    vad = ScriptedVad(frames((0.9, 1.0), (0.0, 0.3), (0.9, 1.0), (0.0, 1.0)))
    session = LiveSession(LiveOptions(interim_interval_s=30.0), TextDecoder(), vad)
    feed(session, audio, 2.5)  # the pause's decode was queued, then speech came back before anyone took it
    assert session.take_stale() == []
    [fresh] = session.take_requests()  # only the decode of the silence after the second speech
    assert len(fresh.prompt["samples"]) > 2.0 * SR and session.pending_request_ids() == [fresh.request_id]


def test_speculative_silence_is_validated():
    with pytest.raises(ValueError, match="speculative_silence_ms"):
        LiveOptions(speculative_silence_ms=-1)


def test_the_turns_interim_decode_goes_on_beside_the_speculative_one_and_the_commit_drops_it(audio):
    vad = ScriptedVad(frames((0.9, 1.5), (0.0, 1.0)))
    session = LiveSession(LiveOptions(interim_interval_s=1.0), TextDecoder(), vad)
    feed(session, audio, 1.1)
    [interim] = session.take_requests()
    assert interim.prompt["interim"]
    feed(session, audio, 0.6, start=1.1)  # 200 ms into the silence
    [speculative] = session.take_requests()
    assert not speculative.prompt["interim"] and session.take_stale() == []  # should speech resume, it counts
    assert session.pending_request_ids() == sorted([interim.request_id, speculative.request_id])
    events = feed(session, audio, 0.5, start=1.7)
    assert [type(e) for e in events] == [SpeechStopped, Committed]
    assert session.take_stale() == [interim.request_id]  # the turn ended: the owner aborts it
    with pytest.raises(ValueError, match="request_id"):
        answer(session, interim, "Hello")
    assert answer(session, speculative, "Hello there.")[-1].transcript == "Hello there."


def test_an_interim_decode_running_through_a_pause_still_gives_deltas(audio):
    vad = ScriptedVad(frames((0.9, 2.5), (0.0, 0.3), (0.9, 1.0), (0.0, 1.0)))
    session = LiveSession(LiveOptions(interim_interval_s=1.0), TextDecoder(), vad)
    feed(session, audio, 1.1)
    [first] = session.take_requests()
    assert answer(session, first, "the cat") == []
    feed(session, audio, 1.0, start=1.1)  # the tick at 2.048 s
    [second] = session.take_requests()
    feed(session, audio, 0.6, start=2.1)  # 200 ms into the pause: a speculative decode beside the interim one
    [speculative] = session.take_requests()
    assert not speculative.prompt["interim"] and session.take_stale() == []
    feed(session, audio, 0.3, start=2.7)  # speech again: the speculative decode is stale, the interim one is not
    assert session.take_stale() == [speculative.request_id]
    [delta] = answer(session, second, "the cat sat")
    assert delta.text == "the cat"


def test_a_queued_interim_decode_is_withdrawn_not_aborted_when_the_turn_ends(audio):
    vad = ScriptedVad(frames((0.9, 1.5), (0.0, 1.0)))
    session = LiveSession(LiveOptions(interim_interval_s=1.0, speculative_silence_ms=None), TextDecoder(), vad)
    feed(session, audio, 1.1)  # an interim decode is queued, nobody takes it
    events = feed(session, audio, 1.0, start=1.1)
    assert [type(e) for e in events] == [SpeechStopped, Committed]
    assert session.take_stale() == []
    [final] = session.take_requests()
    assert not final.prompt["interim"] and session.pending_request_ids() == [final.request_id]


def test_the_final_decode_overtakes_the_running_interim_decode_of_its_turn_only(audio):
    vad = ScriptedVad(frames((0.9, 1.5), (0.0, 0.7), (0.9, 1.3)))
    session = LiveSession(LiveOptions(interim_interval_s=1.0, speculative_silence_ms=None), TextDecoder(), vad)
    feed(session, audio, 1.1)
    [first] = session.take_requests()
    events = feed(session, audio, 1.0, start=1.1)  # the first turn ends; the next starts at 2.2 s
    assert [type(e) for e in events] == [SpeechStopped, Committed]
    assert session.take_stale() == [first.request_id]
    [final] = session.take_requests()
    feed(session, audio, 1.1, start=2.1)
    [second] = session.take_requests()  # the second turn's interim decode
    assert second.prompt["interim"]
    assert answer(session, final, "One.")[-1].transcript == "One."
    assert session.take_stale() == [] and session.pending_request_ids() == [second.request_id]


def test_words_agreed_beside_the_speculative_decode_do_not_stop_its_adoption(audio):
    vad = ScriptedVad(frames((0.9, 2.5), (0.0, 1.0)))
    session = LiveSession(LiveOptions(interim_interval_s=1.0), TextDecoder(), vad)
    feed(session, audio, 1.1)
    [first] = session.take_requests()
    assert answer(session, first, "the cat") == []
    feed(session, audio, 1.0, start=1.1)
    [second] = session.take_requests()
    feed(session, audio, 0.6, start=2.1)  # the speculative decode starts with nothing sent yet
    [speculative] = session.take_requests()
    assert speculative.prompt["prefix_text"] is None
    [delta] = answer(session, second, "the cat sat")  # the interim decode beside it agrees two words
    assert delta.text == "the cat"
    events = feed(session, audio, 0.5, start=2.7)
    assert [type(e) for e in events] == [SpeechStopped, Committed]
    assert session.take_requests() == []  # adopted: no second decode of the turn
    events = answer(session, speculative, "the cat sat on the mat.")
    assert [e.text for e in events[:-1]] == [" sat on the mat."]
    assert events[-1].transcript == "the cat sat on the mat."


@pytest.mark.parametrize("prefix, start, extends", [
    ("the cat sat", "the cat", True), ("the cat", "the cat", True), ("the cat", None, True), (None, None, True),
    ("the dog sat", "the cat", False), (None, "the cat", False), ("the", "the cat", False)])
def test_a_speculation_is_adopted_while_the_final_prefix_extends_its_own(prefix, start, extends):
    from seq2seq_engine.transcription.live.speculation import _extends
    assert _extends(prefix, start) is extends
