"""The bounds of limits.py on a real server (SmolLM2 and Whisper tiny.en side by side), driven by the official `openai`
client and, for the shapes it cannot send, raw httpx: one past each bound is a 4xx whose `param` names the field
and whose message names the limit; at the bound a request still runs."""
import httpx
import pytest
from conftest import require_model
from server_utils import build_engine, running_models, wait_until_idle
from silent_media import silent_wav

from seq2seq_engine.entrypoints.openai import limits

openai = pytest.importorskip("openai")
pytestmark = pytest.mark.usefixtures("one_thread")

TEXT, AUDIO = "smollm2-135m", "whisper-tiny.en"
AUDIO_SEQS = 8  # so the audio model's max_beam_width is 8
OVER_STRING = "string_above_max_length"
OVER_ARRAY = "array_above_max_length"


@pytest.fixture(scope="module")
def server(one_thread):
    engines = {TEXT: build_engine(require_model(TEXT), max_num_seqs=4, max_model_len=256),
               AUDIO: build_engine(require_model(AUDIO), max_num_seqs=AUDIO_SEQS)}
    with running_models(engines) as run:
        yield run
        for name in engines:
            state = wait_until_idle(run, name)
            assert state["unfinished"] == 0 and state["free"] == state["total"]


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def wav():
    return silent_wav(2)


def _refused(call, param, limit, code=None, status=400):
    """The openai client's error for `call`: `status`, `param` and `code` as given, the limit in its message."""
    with pytest.raises(openai.APIStatusError) as caught:
        call()
    error = caught.value
    assert (error.status_code, error.param) == (status, param), error.body
    assert str(limit) in error.message and (code is None or error.code == code), error.body
    return error


def _error(response, param, limit, code=None, status=400):
    """The error body of a raw response, checked the same way."""
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["param"] == param and str(limit) in error["message"], error
    assert code is None or error["code"] == code, error
    return error


SAMPLING_CASES = [
    ("model", {"model": "m" * (limits.MAX_MODEL_CHARS + 1)}, limits.MAX_MODEL_CHARS, OVER_STRING),
    ("user", {"user": "u" * (limits.MAX_USER_CHARS + 1)}, limits.MAX_USER_CHARS, OVER_STRING),
    ("stop", {"stop": ["s"] * (limits.MAX_STOP_STRINGS + 1)}, limits.MAX_STOP_STRINGS, OVER_ARRAY),
    ("stop", {"stop": ["s" * (limits.MAX_STOP_CHARS + 1)]}, limits.MAX_STOP_CHARS, OVER_STRING),
    ("logit_bias", {"logit_bias": {str(i): 0 for i in range(limits.MAX_VOCABULARY_IDS + 1)}},
     limits.MAX_VOCABULARY_IDS, OVER_ARRAY),
    ("stop_token_ids", {"extra_body": {"stop_token_ids": [0] * (limits.MAX_STOP_TOKEN_IDS + 1)}},
     limits.MAX_STOP_TOKEN_IDS, OVER_ARRAY),
    ("bad_words", {"extra_body": {"bad_words": ["w"] * (limits.MAX_BAD_WORDS + 1)}}, limits.MAX_BAD_WORDS, OVER_ARRAY),
    ("bad_words", {"extra_body": {"bad_words": ["w" * (limits.MAX_BAD_WORD_CHARS + 1)]}}, limits.MAX_BAD_WORD_CHARS,
     OVER_STRING),
    ("allowed_token_ids", {"extra_body": {"allowed_token_ids": [0] * (limits.MAX_VOCABULARY_IDS + 1)}},
     limits.MAX_VOCABULARY_IDS, OVER_ARRAY),
]


@pytest.mark.parametrize("param, fields, limit, code", SAMPLING_CASES,
                         ids=[f"{case[0]}-{case[2]}" for case in SAMPLING_CASES])
def test_sampling_fields_past_their_bound_name_the_field(client, param, fields, limit, code):
    completion = {"model": TEXT, "prompt": "Hi", "max_tokens": 1, **fields}
    _refused(lambda: client.completions.create(**completion), param, limit, code)
    chat = {"model": TEXT, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1, **fields}
    _refused(lambda: client.chat.completions.create(**chat), param, limit, code)


def test_sampling_fields_at_their_bound_still_run(client):
    response = client.completions.create(
        model=TEXT, prompt="Hi", max_tokens=1, user="u" * limits.MAX_USER_CHARS,
        stop=["s" * limits.MAX_STOP_CHARS] + ["t"] * (limits.MAX_STOP_STRINGS - 1),
        extra_body={"bad_words": ["w"] * 4 + ["w" * limits.MAX_BAD_WORD_CHARS],
                    "stop_token_ids": [0] * limits.MAX_STOP_TOKEN_IDS})
    assert len(response.choices) == 1


def test_prompt_count_is_bounded(client):
    _refused(lambda: client.completions.create(model=TEXT, prompt=["Hi"] * (limits.MAX_PROMPTS + 1), max_tokens=1),
             "prompt", limits.MAX_PROMPTS, OVER_ARRAY)
    _refused(lambda: client.completions.create(model=TEXT, prompt=[[1]] * (limits.MAX_PROMPTS + 1), max_tokens=1),
             "prompt", limits.MAX_PROMPTS, OVER_ARRAY)


def test_messages_their_parts_and_names_are_bounded(client, server):
    over = [{"role": "user", "content": "a"}] * (limits.MAX_MESSAGES + 1)
    _refused(lambda: client.chat.completions.create(model=TEXT, messages=over, max_tokens=1), "messages",
             limits.MAX_MESSAGES, OVER_ARRAY)
    parts = [{"role": "user", "content": [{"type": "text", "text": "a"}] * (limits.MAX_CONTENT_PARTS + 1)}]
    _refused(lambda: client.chat.completions.create(model=TEXT, messages=parts, max_tokens=1),
             "messages.0.content", limits.MAX_CONTENT_PARTS, OVER_ARRAY)
    named = [{"role": "user", "content": "Hi", "name": "n" * (limits.MAX_MESSAGE_NAME_CHARS + 1)}]
    _refused(lambda: client.chat.completions.create(model=TEXT, messages=named, max_tokens=1),
             "messages.0.name", limits.MAX_MESSAGE_NAME_CHARS, OVER_STRING)
    _error(httpx.post(f"{server.url}/tokenize", json={"model": TEXT, "messages": over}, timeout=60), "messages",
           limits.MAX_MESSAGES, OVER_ARRAY)
    at_bound = [{"role": "user", "content": [{"type": "text", "text": ""}] * limits.MAX_CONTENT_PARTS,
                 "name": "n" * limits.MAX_MESSAGE_NAME_CHARS}]
    assert client.chat.completions.create(model=TEXT, messages=at_bound, max_tokens=1).choices


def test_token_routes_bound_the_model_name_and_the_tokens(server):
    long_name = "m" * (limits.MAX_MODEL_CHARS + 1)
    for path, body in (("/tokenize", {"model": long_name, "prompt": "Hi"}),
                       ("/detokenize", {"model": long_name, "tokens": [1]})):
        _error(httpx.post(f"{server.url}{path}", json=body, timeout=60), "model", limits.MAX_MODEL_CHARS, OVER_STRING)
    tokens = [1] * (limits.MAX_DETOKENIZE_TOKENS + 1)
    _error(httpx.post(f"{server.url}/detokenize", json={"model": TEXT, "tokens": tokens}, timeout=60), "tokens",
           limits.MAX_DETOKENIZE_TOKENS, OVER_ARRAY)


def test_audio_fields_the_openai_client_sends_are_bounded(client, wav):
    def transcribe(**fields):
        return lambda: client.audio.transcriptions.create(model=AUDIO, file=("a.wav", wav), **fields)
    _refused(transcribe(prompt="p" * (limits.MAX_AUDIO_PROMPT_CHARS + 1)), "prompt", limits.MAX_AUDIO_PROMPT_CHARS,
             OVER_STRING)
    _refused(transcribe(language="x" * (limits.MAX_LANGUAGE_CHARS + 1)), "language", limits.MAX_LANGUAGE_CHARS,
             OVER_STRING)
    _refused(transcribe(response_format="verbose_json", timestamp_granularities=["segment", "word", "segment"]),
             "timestamp_granularities[]", limits.MAX_TIMESTAMP_GRANULARITIES, OVER_ARRAY)
    with pytest.raises(openai.APIStatusError) as caught:
        client.audio.translations.create(model="m" * (limits.MAX_MODEL_CHARS + 1), file=("a.wav", wav))
    assert (caught.value.status_code, caught.value.param, caught.value.code) == (400, "model", OVER_STRING)
    at_bound = "p" * limits.MAX_AUDIO_PROMPT_CHARS
    assert client.audio.transcriptions.create(model=AUDIO, file=("a.wav", wav), prompt=at_bound).text == ""


def _counted(count: int, step: float = 0.001) -> str:
    return ",".join(f"{index * step:.3f}" for index in range(count))


AUDIO_FIELD_CASES = [
    ("hotwords", {"hotwords": "h" * (limits.MAX_AUDIO_PROMPT_CHARS + 1)}, limits.MAX_AUDIO_PROMPT_CHARS, OVER_STRING),
    ("prefix", {"prefix": "p" * (limits.MAX_AUDIO_PROMPT_CHARS + 1)}, limits.MAX_AUDIO_PROMPT_CHARS, OVER_STRING),
    ("temperature", {"temperature": ",".join(["0"] * (limits.MAX_TEMPERATURES + 1))}, limits.MAX_TEMPERATURES,
     OVER_ARRAY),
    ("clip_timestamps", {"clip_timestamps": _counted(limits.MAX_CLIP_TIMESTAMPS + 1)}, limits.MAX_CLIP_TIMESTAMPS,
     OVER_ARRAY),
    ("suppress_tokens", {"suppress_tokens": ",".join(["1"] * (limits.MAX_VOCABULARY_IDS + 1))},
     limits.MAX_VOCABULARY_IDS, OVER_ARRAY),
    ("vad_parameters", {"vad_parameters": '{"threshold": 0.5' + " " * limits.MAX_VAD_PARAMETERS_CHARS + "}"},
     limits.MAX_VAD_PARAMETERS_CHARS, OVER_STRING),
    ("model", {"model": "m" * (limits.MAX_MODEL_CHARS + 1)}, limits.MAX_MODEL_CHARS, OVER_STRING),
    ("beam_width", {"beam_size": str(AUDIO_SEQS + 1)}, AUDIO_SEQS, None),
    ("best_of", {"best_of": str(AUDIO_SEQS + 1), "temperature": "0.5"}, AUDIO_SEQS, None),
]


@pytest.mark.parametrize("param, fields, limit, code", AUDIO_FIELD_CASES, ids=[case[0] for case in AUDIO_FIELD_CASES])
def test_audio_form_fields_past_their_bound_name_the_field(server, wav, param, fields, limit, code):
    response = httpx.post(f"{server.url}/v1/audio/transcriptions", files={"file": ("a.wav", wav)},
                          data={"model": AUDIO, **fields}, timeout=120)
    _error(response, param, limit, code)


def _post_form(server, files, data):
    return httpx.post(f"{server.url}/v1/audio/transcriptions", files=files, data=data, timeout=120)


def test_the_multipart_form_is_bounded_naming_the_part(server, wav):
    two_files = [("file", ("a.wav", wav)), ("file", ("b.wav", wav))]
    _error(_post_form(server, two_files, {"model": AUDIO}), "file", limits.MAX_FORM_FILES, OVER_ARRAY)
    fields = {"model": AUDIO, **{f"field{index:03d}": "1" for index in range(limits.MAX_FORM_FIELDS)}}
    _error(_post_form(server, {"file": ("a.wav", wav)}, fields), "field099", limits.MAX_FORM_FIELDS, OVER_ARRAY)
    big = {"model": AUDIO, "hotwords": "h" * (limits.MAX_FORM_FIELD_BYTES + 1)}
    _error(_post_form(server, {"file": ("a.wav", wav)}, big), "hotwords", limits.MAX_FORM_FIELD_BYTES, OVER_STRING)
    long_name = "n" * (limits.MAX_PART_HEADER_LINE_BYTES + 1) + ".wav"
    _error(_post_form(server, {"file": (long_name, wav)}, {"model": AUDIO}), "file", limits.MAX_PART_HEADER_LINE_BYTES)


def test_deeply_nested_vad_parameters_are_a_400_not_a_500(server, wav):
    depth = limits.MAX_VAD_PARAMETERS_CHARS // 2 - 1  # within the size bound, deeper than Python's recursion limit
    nested = {"model": AUDIO, "vad_parameters": "[" * depth + "]" * depth}
    response = _post_form(server, {"file": ("a.wav", wav)}, nested)
    assert response.status_code == 400 and response.json()["error"]["param"] == "vad_parameters", response.text
