"""LiveSession's turn logic with a scripted VAD and a stand-in decoder (the real engine and Silero run in
test_live_session.py): where turns start and stop, which audio each decode gets, interim decodes one at a time,
deltas and Completed in commit order, clear, client commits, the 30 s rollover and the bound on buffered audio."""
import numpy as np
import pytest
from transcription.live_script import FRAME, SR, ScriptedVad, TextDecoder, answer, feed, frames

from seq2seq_engine.transcription.live import (Cleared, Committed, Completed, DecodeRequest, Delta, LiveOptions,
                                               LiveSession, SpeechStarted, SpeechStopped, TurnDetection)


class DetectingDecoder(TextDecoder):
    """A multilingual model: a detection request is answered with one token, the language's letters' sum."""

    needs_language = True

    def detection_request(self, request_id, samples):
        return DecodeRequest(request_id, {"samples": samples, "detect": True}, None)

    def language_of(self, token_ids):
        return {sum(b"de"): "de"}[token_ids[0]]

    def request(self, request_id, samples, language, prompt_text, interim=False, prefix_text=None):
        assert language == "de"
        return super().request(request_id, samples, language, prompt_text, interim, prefix_text)


@pytest.fixture()
def audio():
    return np.random.default_rng(0).uniform(-0.5, 0.5, 80 * SR).astype(np.float32)


def test_a_turn_starts_with_its_padding_and_stops_after_the_silence(audio):
    vad = ScriptedVad(frames((0.1, 1.0), (0.9, 2.0), (0.2, 1.0)))
    session = LiveSession(LiveOptions(interim_interval_s=5.0, turn_detection=TurnDetection(0.5, 200, 320),
                                      speculative_silence_ms=None), TextDecoder(), vad)
    events = feed(session, audio, 4.0)
    item = events[0].item_id
    start_frame, stop_frame = round(SR / FRAME), round(SR / FRAME) + round(2 * SR / FRAME) + 10  # 10 frames = 320 ms
    assert events == [SpeechStarted(item, start_frame * FRAME * 1000 // SR - 200),
                      SpeechStopped(item, stop_frame * FRAME * 1000 // SR), Committed(item, None)]
    [final] = session.take_requests()
    np.testing.assert_array_equal(final.prompt["samples"], audio[start_frame * FRAME - 200 * 16:stop_frame * FRAME])
    assert session.pending_request_ids() == [final.request_id]
    events = answer(session, final, "Hello there.")
    assert events == [Delta(item, "Hello there."), Completed(item, "Hello there.", (stop_frame - start_frame) *
                                                             FRAME / SR + 0.2)]
    assert session.pending_request_ids() == [] and session.buffered_seconds < 0.3
    with pytest.raises(ValueError, match="request_id"):
        answer(session, final, "again")


def test_interim_decodes_one_at_a_time_and_deltas_agree_and_prefix_the_transcript(audio):
    vad = ScriptedVad(frames((0.9, 4.0), (0.0, 1.0)))
    session = LiveSession(LiveOptions(interim_interval_s=1.0, speculative_silence_ms=None), TextDecoder(), vad)
    feed(session, audio, 1.05)
    [first] = session.take_requests()
    assert first.prompt["interim"] and len(first.prompt["samples"]) >= SR
    feed(session, audio, 1.05, start=1.05)  # the tick at 2.048 s comes while the first is running: skipped
    assert session.take_requests() == []
    assert answer(session, first, "the cat") == []
    feed(session, audio, 1.0, start=2.1)  # the tick at 3.072 s
    [second] = session.take_requests()
    assert len(second.prompt["samples"]) == 3.072 * SR
    [delta] = answer(session, second, "the cat sat")
    assert delta.text == "the cat"
    feed(session, audio, 1.2, start=3.1)
    [third] = session.take_requests()
    events = feed(session, audio, 1.0, start=4.3)
    assert [type(e) for e in events] == [SpeechStopped, Committed]
    [final] = session.take_requests()
    assert not final.prompt["interim"] and final.prompt["prefix_text"] == "the cat"  # it continues the deltas
    assert session.take_stale() == [third.request_id]  # the turn is committed: its final decode decides
    events = answer(session, final, "sat on the mat.")
    assert [e.text for e in events[:-1]] == [" sat on the mat."]
    assert events[-1].transcript == "the cat sat on the mat."


def test_a_busy_owner_drops_the_interim_decode_and_the_next_tick_makes_one_again(audio):
    vad = ScriptedVad(frames((0.9, 4.0), (0.0, 1.0)))
    session = LiveSession(LiveOptions(interim_interval_s=1.0), TextDecoder(), vad)
    feed(session, audio, 1.05)
    assert session.take_requests(interim=False) == []     # dropped, not handed out
    assert session.pending_request_ids() == []
    feed(session, audio, 1.05, start=1.05)                 # the tick at 2.048 s: a new interim decode
    [interim] = session.take_requests()
    assert interim.prompt["interim"] and len(interim.prompt["samples"]) == 2.048 * SR
    feed(session, audio, 2.2, start=2.1)
    events = feed(session, audio, 1.0, start=4.3)
    assert [type(e) for e in events] == [SpeechStopped, Committed]
    [final] = session.take_requests(interim=False)          # a final decode is always handed out
    assert not final.prompt["interim"]
    assert session.take_stale() == [interim.request_id]    # the silence's decodes overtook it: the owner aborts it
    assert answer(session, final, "the cat sat on the mat.")[-1].transcript == "the cat sat on the mat."


class RetokenizingDecoder(TextDecoder):
    """The final text does not start with the forced prefix (as when a tokenizer splits its words differently)."""

    def text(self, token_ids, prefix_text=None):
        return bytes(token_ids).decode()


def test_a_final_text_that_disagrees_keeps_the_deltas_and_completes_with_its_own_text(audio):
    session = LiveSession(LiveOptions(interim_interval_s=1.0, speculative_silence_ms=None), RetokenizingDecoder(),
                          ScriptedVad(frames((0.9, 3.1))))
    feed(session, audio, 1.1)
    answer(session, session.take_requests()[0], "the cap")
    feed(session, audio, 1.0, start=1.1)
    assert answer(session, session.take_requests()[0], "the cap sat")[0].text == "the cap"
    feed(session, audio, 1.5, start=2.1)
    session.take_requests()
    [committed] = session.commit()
    [final] = session.take_requests()
    assert final.prompt["prefix_text"] == "the cap"
    assert answer(session, final, "the cat sat.") == [Completed(committed.item_id, "the cat sat.", 3.6)]


def test_completed_comes_in_commit_order_and_clear_drops_the_turn(audio):
    script = frames((0.9, 1.0), (0.0, 1.0), (0.9, 1.0), (0.0, 1.0), (0.9, 1.0))
    session = LiveSession(LiveOptions(interim_interval_s=10.0, max_decodes_in_flight=2), TextDecoder(),
                          ScriptedVad(script))
    events = feed(session, audio, 3.9)
    first, second = [e for e in events if isinstance(e, Committed)]
    assert second.previous_item_id == first.item_id
    request_a, request_b = session.take_requests()
    assert answer(session, request_b, "two") == []  # waits for the first turn
    assert [e.transcript for e in answer(session, request_a, "one") if isinstance(e, Completed)] == ["one", "two"]
    events = feed(session, audio, 0.5, start=3.9)
    assert isinstance(events[0], SpeechStarted)
    assert session.buffered_seconds > 0.5
    assert session.clear() == [Cleared()]
    assert session.buffered_seconds == 0 and session.take_requests() == []
    with pytest.raises(ValueError, match="100 ms"):
        session.commit()


def test_without_turn_detection_only_commit_ends_a_turn(audio):
    session = LiveSession(LiveOptions(turn_detection=None), TextDecoder())
    with pytest.raises(ValueError, match="0 ms"):
        session.commit()
    assert feed(session, audio, 3.0) == [] and session.take_requests() == []
    [committed] = session.commit()
    [final] = session.take_requests()
    np.testing.assert_array_equal(final.prompt["samples"], audio[:3 * SR])
    assert answer(session, final, "hi") == [Delta(committed.item_id, "hi"), Completed(committed.item_id, "hi", 3.0)]


def test_a_long_turn_rolls_over_with_the_first_window_as_prompt(audio):
    session = LiveSession(LiveOptions(turn_detection=None, prompt="Glossary."), TextDecoder())
    feed(session, audio, 65.0, chunk=16000)
    part_one, = session.take_requests()  # the second window waits for the first one's text
    np.testing.assert_array_equal(part_one.prompt["samples"], audio[:30 * SR])
    assert part_one.prompt["prefix_text"] is None  # no delta was sent
    assert part_one.prompt["prompt_text"] == "Glossary."
    assert session.buffered_seconds == pytest.approx(35.0)
    answer(session, part_one, "first part.")
    part_two, = session.take_requests()
    np.testing.assert_array_equal(part_two.prompt["samples"], audio[30 * SR:60 * SR])
    assert part_two.prompt["prompt_text"] == "Glossary. first part."
    session.commit()
    answer(session, part_two, "second part.")
    [last] = session.take_requests()
    np.testing.assert_array_equal(last.prompt["samples"], audio[60 * SR:65 * SR])
    assert last.prompt["prompt_text"] == "Glossary. first part. second part."
    assert answer(session, last, "end.")[-1].transcript == "first part. second part. end."


def test_buffered_audio_beyond_the_bound_commits_the_turn_early(audio):
    session = LiveSession(LiveOptions(max_buffered_s=5.0, interim_interval_s=30.0), TextDecoder(),
                          ScriptedVad(frames((0.9, 12.0))))
    events = feed(session, audio, 12.0)
    kinds = [type(e) for e in events]
    assert kinds[:3] == [SpeechStarted, SpeechStopped, Committed] and kinds.count(Committed) == 2
    assert session.buffered_seconds <= 5.0
    lengths = [len(r.prompt["samples"]) / SR for r in session.take_requests()]
    assert all(4.9 < length <= 5.0 + 0.05 for length in lengths)


@pytest.mark.parametrize("field, kwargs", [
    ("threshold", dict(threshold=1.5)), ("prefix_padding_ms", dict(prefix_padding_ms=-1)),
    ("silence_duration_ms", dict(silence_duration_ms=0.5))])
def test_turn_detection_is_validated(field, kwargs):
    with pytest.raises(ValueError, match=field):
        TurnDetection(**kwargs)


@pytest.mark.parametrize("field, kwargs", [
    ("interim_interval_s", dict(interim_interval_s=0)), ("max_buffered_s", dict(max_buffered_s=0.5)),
    ("language", dict(language="")), ("turn_detection", dict(turn_detection={"threshold": 0.5}))])
def test_options_are_validated(field, kwargs):
    with pytest.raises(ValueError, match=field):
        LiveOptions(**kwargs)


def test_samples_are_checked(audio):
    session = LiveSession(LiveOptions(turn_detection=None), TextDecoder())
    with pytest.raises(TypeError, match="numpy"):
        session.append([0.1, 0.2])
    with pytest.raises(ValueError, match="1-D"):
        session.append(audio[:100].reshape(2, 50))
    with pytest.raises(TypeError, match="float"):
        session.append(np.ones(10, dtype=np.int16))


def test_without_a_language_a_multilingual_model_detects_it_once_and_holds_the_decodes_until_then(audio):
    session = LiveSession(LiveOptions(interim_interval_s=1.0), DetectingDecoder(), ScriptedVad(frames((0.9, 2.2))))
    feed(session, audio, 1.1)
    [detection] = session.take_requests()
    assert detection.prompt["detect"] and len(detection.prompt["samples"]) >= SR
    events = feed(session, audio, 1.8, start=1.1)  # no interim decode before the language is known
    assert [type(e) for e in events] == [SpeechStopped, Committed] and session.take_requests() == []
    assert session.buffered_seconds >= 2.5  # the held decode's audio
    assert session.on_output(detection.request_id, [sum(b"de")]) == []
    assert session.language == "de"
    [final] = session.take_requests()
    assert len(final.prompt["samples"]) > 2.5 * SR
    np.testing.assert_array_equal(final.prompt["samples"], audio[:len(final.prompt["samples"])])
    assert answer(session, final, "Hallo Welt.")[-1].transcript == "Hallo Welt."
    feed(session, audio, 1.5, start=2.9)
    assert session.take_requests() == []  # silence: nothing, and no second detection


def test_decodes_of_a_cleared_turn_stay_pending_for_abort_and_their_outputs_change_nothing(audio):
    session = LiveSession(LiveOptions(interim_interval_s=1.0), TextDecoder(), ScriptedVad(frames((0.9, 5.0))))
    started = feed(session, audio, 1.1)[0]
    [interim] = session.take_requests()
    assert session.clear() == [Cleared()]
    assert session.pending_request_ids() == [interim.request_id]  # the owner aborts it, or lets it finish
    assert answer(session, interim, "words") == [] and session.pending_request_ids() == []
    events = feed(session, audio, 0.5, start=1.1)
    assert isinstance(events[0], SpeechStarted) and events[0].item_id != started.item_id
    assert events[0].audio_start_ms == 1100  # the cleared audio is gone: no padding from before the clear
