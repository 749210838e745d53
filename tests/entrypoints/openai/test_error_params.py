"""Each surface names the field of an error from its type (seq2seq_engine/errors.py) through its own table, whatever
the message says: the request field of an engine refusal, the realtime session field, the audio form field, the
command-line flag; and an upload's 413 comes from its result's failure kind, not from the error's text."""
import argparse

import pytest

from seq2seq_engine.entrypoints.openai.audio import _check_decoded
from seq2seq_engine.entrypoints.openai.audio_form import AudioRequest, options_param
from seq2seq_engine.entrypoints.openai.client import _param_of
from seq2seq_engine.entrypoints.openai.errors import APIError
from seq2seq_engine.entrypoints.openai.realtime.handler import _session_field
from seq2seq_engine.entrypoints.transcribe_flags import subtitle_options
from seq2seq_engine.errors import ParameterError, ParameterTypeError
from seq2seq_engine.transcription.live.options import LiveOptions, TurnDetection
from seq2seq_engine.transcription.options import TranscriptionOptions
from seq2seq_engine.transcription.output.results import FailureKind, TranscriptionResult
from seq2seq_engine.transcription.output.subtitles import SubtitleOptions
from seq2seq_engine.transcription.prompts import WhisperTokens

EN = WhisperTokens(sot=50257, eot=50256, no_timestamps=50362, vocab_size=51864, max_target_positions=448,
                   is_multilingual=False, language_ids={"en": 50258}, transcribe=50358, translate=50357,
                   start_of_prev=50360, suppress_tokens=(), begin_suppress_tokens=(), max_initial_timestamp_index=50)


def _error_of(build):
    with pytest.raises((ValueError, TypeError)) as caught:
        build()
    return caught.value


@pytest.mark.parametrize("error, fields, param", [
    (ParameterError("beam_width=9 exceeds max_beam_width=4", "beam_width"), {"beam_width": "best_of"}, "best_of"),
    (ParameterTypeError("max_tokens must be an int, got str", "max_tokens"), {"max_tokens": "max_completion_tokens"},
     "max_completion_tokens"),
    (ParameterError("top_p must be in (0.0, 1.0], got 2", "top_p"), {}, "top_p"),
    (ParameterError("_bad_words_token_ids must be a list", "_bad_words_token_ids"), {}, "messages"),  # internal
    (ValueError("max_tokens must be >= 1, got 0"), {}, "messages"),  # its text names a field; its type names none
])
def test_an_engine_refusal_names_the_request_field(error, fields, param):
    assert _param_of(error, "messages", fields) == param


@pytest.mark.parametrize("build, field", [
    (lambda: TurnDetection(threshold=2.0), "session.audio.input.turn_detection.threshold"),
    (lambda: TurnDetection(silence_duration_ms=-5), "session.audio.input.turn_detection.silence_duration_ms"),
    (lambda: EN.language_code("fr"), "session.audio.input.transcription.language"),
    (lambda: LiveOptions(prompt=7), "session.audio.input.transcription.prompt"),
    (lambda: LiveOptions(max_buffered_s=0.5), None),  # the server's own setting, no session field
    (lambda: EN.prompt(task="translate"), None),
])
def test_a_live_session_error_names_the_session_field(build, field):
    assert _session_field(_error_of(build)) == field
    assert _session_field(ValueError("language 'fr' is not supported")) is None


@pytest.mark.parametrize("build, field", [
    (lambda: TranscriptionOptions(initial_prompt="  "), "prompt"), (lambda: TranscriptionOptions(best_of=0), "best_of"),
    (lambda: TranscriptionOptions(vad_parameters=[0.5]), "vad_parameters"),
    (lambda: EN.language_code("fr"), "language"), (lambda: EN.prompt(task="translate"), None),  # task: the endpoint's
    (lambda: TranscriptionOptions(use_tqdm="yes"), None),
])
def test_a_transcription_error_names_the_form_field(build, field):
    assert options_param(_error_of(build)) == field
    assert options_param(ValueError("best_of must be an int >= 1, got 0")) is None


def _upload():
    return AudioRequest(b"RIFF", "a.wav", None, "json", False, SubtitleOptions(), TranscriptionOptions())


@pytest.mark.parametrize("error, failure, status, code", [
    ("a.wav: stopped at 10 s", FailureKind.AUDIO_TOO_LONG, 413, "audio_too_long"),
    ("a.wav: the audio is longer than max_audio_seconds (10 s)", FailureKind.AUDIO, 400, "invalid_audio"),
    ("a.wav: a request was ignored by the engine", FailureKind.ENGINE, 400, "invalid_audio"),
])
def test_an_upload_failure_is_told_by_its_kind(error, failure, status, code):
    result = TranscriptionResult("", None, [], error, 0.0, None, "a.wav", failure)
    with pytest.raises(APIError) as caught:
        _check_decoded(result, _upload(), 10.0)
    assert (caught.value.status, caught.value.code, caught.value.param) == (status, code, "file")


def test_a_cue_flag_error_names_the_flag_and_its_requirement():
    args = argparse.Namespace(max_line_width=None, max_line_count=-1, max_words_per_line=None, highlight_words=None)
    with pytest.raises(ValueError) as caught:
        subtitle_options(args)
    assert str(caught.value) == "--max-line-count must be an int >= 1, got -1"
