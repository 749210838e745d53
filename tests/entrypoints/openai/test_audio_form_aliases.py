"""The audio routes' form takes faster-whisper's and openai-whisper's names of the extra fields (option_aliases.py):
beam_size, logprob_threshold, sample_len; an alias and its field must agree; an unknown field is a 400 naming it and
the closest field (the parser alone, then one request to a real server on whisper-tiny.en)."""
import asyncio
import io
import os

import httpx
import pytest
from conftest import require_speech_clips
from server_utils import build_engine, running_server
from starlette.datastructures import FormData, UploadFile

from seq2seq_engine.entrypoints.openai.audio_form import parse_audio_form
from seq2seq_engine.entrypoints.openai.errors import APIError


def _parse(**fields):
    upload = UploadFile(file=io.BytesIO(b"RIFF not decoded here"), filename="a.wav")
    form = FormData([("file", upload)] + [(name, value) for name, value in fields.items()])
    return asyncio.run(parse_audio_form(form, "transcribe", 1 << 20))


def _refusal(**fields):
    with pytest.raises(APIError) as caught:
        _parse(**fields)
    return caught.value


def test_the_other_names_set_the_same_options():
    options = _parse(beam_size="2", logprob_threshold="-0.5", sample_len="30").options
    assert (options.beam_width, options.log_prob_threshold, options.max_new_tokens) == (2, -0.5, 30)
    assert _parse(logprob_threshold="none").options.log_prob_threshold is None
    assert _parse(beam_size="3", beam_width="3").options.beam_width == 3


def test_their_settings_at_values_that_change_nothing_here_are_accepted():
    plain = _parse(beam_size="2").options
    assert _parse(beam_size="2", patience="1", length_penalty="null", repetition_penalty="1.0",
                  no_repeat_ngram_size="0", multilingual="False", chunk_length="30").options == plain


@pytest.mark.parametrize("fields, param, message", [
    ({"beam_size": "2", "beam_width": "3"}, "beam_width", "beam_size=2 and beam_width=3 set the same option"),
    ({"beam_sise": "2"}, "beam_sise", "unknown field 'beam_sise'; did you mean 'beam_size'?"),
    ({"temprature": "0"}, "temprature", "did you mean 'temperature'?"),
    ({"patience": "2"}, "patience", "field 'patience' (faster-whisper, openai-whisper) is not supported here"),
    ({"multilingual": "true"}, "multilingual", "is not supported here (only at False, what this engine does)"),
    ({"colour": "blue"}, "colour", "unknown field 'colour'; known: beam_size, beam_width"),
    ({"without_timestamps": "true"}, "without_timestamps", "is set by the endpoint and response_format"),
    ({"log_progress": "false"}, "log_progress", "is set by the endpoint"),
    ({"beam_size": "zero"}, "beam_width", "beam_width must be an integer"),  # a value names the option's field
])
def test_refusals_name_the_field(fields, param, message):
    error = _refusal(**fields)
    assert (error.status, error.param) == (400, param) and message in error.message, error.message


@pytest.mark.usefixtures("one_thread")
def test_a_request_with_the_other_names(tiny_dir):
    with open(os.path.join(require_speech_clips(), "en", "hello_world.wav"), "rb") as handle:
        clip = handle.read()
    with running_server(build_engine(tiny_dir, max_num_seqs=4), "whisper-tiny.en") as server:
        url = f"{server.url}/v1/audio/transcriptions"
        fields = {"model": "whisper-tiny.en", "beam_size": "2", "logprob_threshold": "-0.8", "temperature": "0"}
        response = httpx.post(url, timeout=120, files={"file": ("a.wav", clip)}, data=fields)
        assert response.status_code == 200 and "hello" in response.json()["text"].lower(), response.text
        refused = httpx.post(url, timeout=120, files={"file": ("a.wav", clip)}, data={**fields, "beam_sise": "2"})
        error = refused.json()["error"]
        assert refused.status_code == 400 and error["param"] == "beam_sise", error
        assert "did you mean 'beam_size'?" in error["message"], error
