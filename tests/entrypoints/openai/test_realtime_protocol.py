"""The realtime transcription events without a server: client events parsed and refused with the field they name,
session.update applied field by field (checked against the official openai client's own models), and each live
transcription event mapped to OpenAI's server event."""
import base64
import json

import numpy as np
import pytest

from seq2seq_engine.entrypoints.openai.realtime.config import apply_update, session_json
from seq2seq_engine.entrypoints.openai.realtime.protocol import (RealtimeError, SessionConfig, TurnSettings,
                                                                 decode_audio, error_event, live_event_json,
                                                                 parse_event)
from seq2seq_engine.transcription.live import events as live

openai_types = pytest.importorskip("openai.types.realtime")


def _event(body):
    return parse_event(json.dumps(body))


def _refusal(body, config=SessionConfig()):
    with pytest.raises(RealtimeError) as caught:
        event = _event(body)
        if event.type == "session.update":
            apply_update(config, event)
        else:
            decode_audio(event, 1 << 20)
    return caught.value


@pytest.mark.parametrize("text, code", [
    ("{not json", "invalid_json"), ("[1, 2]", "invalid_json"), (b"\x00\x01", "invalid_json"),
    ('{"event_id": "e1"}', "missing_required_parameter"),
    ('{"type": "response.create", "event_id": "e1"}', "invalid_event_type")])
def test_malformed_events_are_refused_with_a_code(text, code):
    with pytest.raises(RealtimeError) as caught:
        parse_event(text)
    assert caught.value.code == code
    if "e1" in str(text):
        assert caught.value.event_id == "e1"


def test_append_decodes_base64_pcm16_and_refuses_bad_audio():
    rng = np.random.default_rng(0)
    samples = rng.integers(-20000, 20000, 480).astype("<i2")
    event = _event({"type": "input_audio_buffer.append", "audio": base64.b64encode(samples.tobytes()).decode()})
    assert np.array_equal(np.frombuffer(decode_audio(event, 1 << 20), "<i2"), samples)
    assert _refusal({"type": "input_audio_buffer.append", "audio": "%%not base64%%"}).code == "invalid_base64"
    odd = base64.b64encode(samples.tobytes()[:5]).decode()
    assert _refusal({"type": "input_audio_buffer.append", "audio": odd}).code == "invalid_audio"
    missing = _refusal({"type": "input_audio_buffer.append", "event_id": "e7"})
    assert (missing.param, missing.event_id) == ("audio", "e7")
    with pytest.raises(RealtimeError, match="at most 100 bytes"):
        decode_audio(event, 100)


def test_session_update_applies_only_the_fields_it_names():
    event = _event({"type": "session.update", "session": {"type": "transcription", "audio": {"input": {
        "format": {"type": "audio/pcm", "rate": 16000},
        "transcription": {"model": "whisper-tiny.en", "language": "en", "prompt": "Quick foxes."},
        "turn_detection": {"type": "server_vad", "threshold": 0.6, "silence_duration_ms": 700}}}}})
    config = apply_update(SessionConfig(), event)
    assert config == SessionConfig(16000, "whisper-tiny.en", "en", "Quick foxes.", TurnSettings(0.6, 300, 700))
    later = apply_update(config, _event({"type": "session.update", "session": {
        "type": "transcription", "audio": {"input": {"turn_detection": None}}}}))
    assert later == SessionConfig(16000, "whisper-tiny.en", "en", "Quick foxes.", None)
    again = apply_update(later, _event({"type": "session.update", "session": {"audio": {"input": {
        "turn_detection": {"type": "server_vad"}}}}}))
    assert again.turn_detection == TurnSettings()


@pytest.mark.parametrize("session, param", [
    ({"type": "realtime"}, "session.type"),
    ({"audio": {"input": {"format": {"type": "audio/pcmu"}}}}, "session.audio.input.format.type"),
    ({"audio": {"input": {"format": {"type": "audio/pcm", "rate": 44100}}}}, "session.audio.input.format.rate"),
    ({"audio": {"input": {"turn_detection": {"type": "semantic_vad"}}}}, "session.audio.input.turn_detection.type"),
    ({"audio": {"input": {"turn_detection": {"type": "server_vad", "threshold": 1.5}}}},
     "session.audio.input.turn_detection.threshold"),
    ({"audio": {"input": {"turn_detection": {"type": "server_vad", "silence_duration_ms": 0.5}}}},
     "session.audio.input.turn_detection.silence_duration_ms"),
    ({"audio": {"input": {"transcription": {"language": 7}}}}, "session.audio.input.transcription.language"),
    ({"audio": {"input": {"transcription": {"keywords": ["fox"]}}}}, "session.audio.input.transcription.keywords"),
    ({"audio": {"input": {"noise_reduction": {"type": "near_field"}}}}, "session.audio.input.noise_reduction"),
    ({"audio": {"input": {"colour": "blue"}}}, "session.audio.input.colour"),
    ({"instructions": "be brief"}, "session.instructions"),
])
def test_bad_session_fields_are_named(session, param):
    error = _refusal({"type": "session.update", "event_id": "u1", "session": session})
    assert (error.param, error.event_id) == (param, "u1")
    assert param.rsplit(".", 1)[-1] in error.message


def test_session_json_and_events_parse_as_the_official_clients_models():
    # OpenAI's own models allow only 24 kHz (the client itself parses server events leniently, so 16000 reads too).
    config = SessionConfig(24000, "whisper-tiny.en", "en", None, TurnSettings(0.4, 200, 800))
    created = openai_types.RealtimeTranscriptionSessionCreateResponse.model_validate(
        session_json(config, "sess_1", "whisper-tiny.en"))
    turn = created.audio.input.turn_detection
    assert (turn.type, turn.threshold, turn.prefix_padding_ms) == ("server_vad", 0.4, 200)
    assert turn.silence_duration_ms == 800
    assert created.audio.input.transcription.language == "en"
    models = {"input_audio_buffer.speech_started": openai_types.InputAudioBufferSpeechStartedEvent,
              "input_audio_buffer.speech_stopped": openai_types.InputAudioBufferSpeechStoppedEvent,
              "input_audio_buffer.committed": openai_types.InputAudioBufferCommittedEvent,
              "input_audio_buffer.cleared": openai_types.InputAudioBufferClearedEvent,
              "conversation.item.input_audio_transcription.delta":
                  openai_types.ConversationItemInputAudioTranscriptionDeltaEvent,
              "conversation.item.input_audio_transcription.completed":
                  openai_types.ConversationItemInputAudioTranscriptionCompletedEvent}
    events = [live.SpeechStarted("item_1", 120), live.SpeechStopped("item_1", 2300), live.Committed("item_1", None),
              live.Cleared(), live.Delta("item_1", "The quick"), live.Completed("item_1", "The quick fox.", 2.18)]
    for event in events:
        body = live_event_json(event)
        parsed = models[body["type"]].model_validate(body)
        assert parsed.event_id.startswith("event_")
    completed = live_event_json(events[-1])
    assert (completed["transcript"], completed["content_index"], completed["usage"]) == (
        "The quick fox.", 0, {"type": "duration", "seconds": 2.18})
    error = error_event(RealtimeError("bad", "invalid_value", "audio", "e3"))
    parsed = openai_types.RealtimeErrorEvent.model_validate(error)
    assert (parsed.error.code, parsed.error.param, parsed.error.event_id) == ("invalid_value", "audio", "e3")
