"""Safety of the server (SmolLM2, with an API key): 401 without the key, an OpenAI-style 4xx for every bad request
class (never a 500), and a client that disconnects mid-stream gives its KV blocks back; the server keeps serving."""
import json
import re
import time

import httpx
import pytest
from conftest import require_model
from server_utils import API_KEY, build_engine, pool_state, running_server, wait_until_idle

openai = pytest.importorskip("openai")
pytestmark = pytest.mark.usefixtures("one_thread")

MODEL = "smollm2-135m"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
UPLOAD_LIMIT_MB = 0.25


@pytest.fixture(scope="module")
def server(one_thread):
    engine = build_engine(require_model(MODEL), max_num_seqs=8, max_model_len=512)
    with running_server(engine, MODEL, api_key=API_KEY, max_upload_bytes=int(UPLOAD_LIMIT_MB * 1024 * 1024)) as run:
        yield run


def _post(server, path, **kwargs):
    headers = {**AUTH, **kwargs.pop("headers", {})}
    return httpx.post(f"{server.url}{path}", headers=headers, timeout=kwargs.pop("timeout", 120), **kwargs)


def _error(response, status, param="unset"):
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["message"]
    if param != "unset":
        assert body["error"]["param"] == param
    return body["error"]


def _still_serving(server):
    response = _post(server, "/v1/completions", json={"model": MODEL, "prompt": "Hi", "max_tokens": 2})
    assert response.status_code == 200 and response.json()["usage"]["completion_tokens"] == 2


def test_api_key_guards_all_but_health_and_metrics(server):
    assert _error(httpx.get(f"{server.url}/v1/models"), 401)["code"] == "invalid_api_key"
    _error(httpx.post(f"{server.url}/tokenize", json={"prompt": "Hi"}), 401)
    _error(httpx.get(f"{server.url}/v1/models", headers={"Authorization": "Bearer wrong"}), 401)
    assert httpx.get(f"{server.url}/v1/models", headers=AUTH).status_code == 200
    assert httpx.get(f"{server.url}/health").status_code == 200
    assert "seq2seq_engine:kv_cache_usage_perc" in httpx.get(f"{server.url}/metrics").text
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        client.models.list()
    good = openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0)
    assert good.completions.create(model=MODEL, prompt="Hi", max_tokens=2).usage.completion_tokens == 2


def test_malformed_json_and_wrong_types(server):
    _error(_post(server, "/v1/completions", content=b'{"model": "x", "prompt": ',
                 headers={"Content-Type": "application/json"}), 400)
    _error(_post(server, "/v1/completions", content=b"[1, 2]", headers={"Content-Type": "application/json"}), 400)
    _error(_post(server, "/v1/completions", json={"model": MODEL, "prompt": "Hi", "max_tokens": "many"}), 400,
           "max_tokens")
    _error(_post(server, "/v1/completions", json={"model": MODEL, "prompt": {"text": "Hi"}}), 400)
    _error(_post(server, "/v1/completions", json={"model": MODEL, "prompt": "Hi", "stream": "yes"}), 400, "stream")
    _error(_post(server, "/v1/chat/completions", json={"model": MODEL, "messages": "Hi"}), 400, "messages")
    _error(_post(server, "/v1/chat/completions", json={"model": MODEL, "messages": []}), 400, "messages")
    _error(_post(server, "/v1/completions", json={"model": MODEL, "prompt": "Hi", "frobnicate": 1}), 400,
           "frobnicate")
    _error(_post(server, "/detokenize", json={"tokens": ["a"]}), 400)
    _still_serving(server)


def test_unknown_model_and_missing_route(server):
    error = _error(_post(server, "/v1/completions", json={"model": "gpt-4", "prompt": "Hi"}), 404, "model")
    assert error["code"] == "model_not_found"
    _error(_post(server, "/v1/chat/completions", json={"model": "gpt-4", "messages": [
        {"role": "user", "content": "Hi"}]}), 404, "model")
    _error(httpx.get(f"{server.url}/v1/nothing-here", headers=AUTH), 404)
    _error(httpx.get(f"{server.url}/v1/completions", headers=AUTH), 405)


@pytest.mark.parametrize("field, value", [("temperature", -1.0), ("top_p", 2.0), ("n", 0), ("max_tokens", 0),
                                          ("logprobs", 1000), ("presence_penalty", 5.0), ("top_k", 0),
                                          ("seed", -3), ("best_of", 100)])
def test_out_of_range_parameters(server, field, value):
    error = _error(_post(server, "/v1/completions", json={"model": MODEL, "prompt": "Hi", field: value}), 400)
    assert field in error["message"]


def test_prompt_too_long(server):
    too_long = {"model": MODEL, "prompt": [1] * 600, "max_tokens": 4}
    assert "512" in _error(_post(server, "/v1/completions", json=too_long), 400, "prompt")["message"]
    almost = {"model": MODEL, "prompt": [1] * 500, "max_tokens": 40}
    assert "max_tokens" in _error(_post(server, "/v1/completions", json=almost), 400)["message"]
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "word " * 700}]}
    _error(_post(server, "/v1/chat/completions", json=chat), 400)
    assert wait_until_idle(server)["unfinished"] == 0


def test_upload_over_the_limit_is_413(server):
    big = b"\0" * int(UPLOAD_LIMIT_MB * 1024 * 1024 * 2)
    response = _post(server, "/v1/audio/transcriptions", files={"file": ("a.wav", big)}, data={"model": MODEL})
    assert _error(response, 413)["code"] == "file_too_large"

    def chunks():  # no Content-Length: the limit is enforced on the bytes received
        for _ in range(8):
            yield b"x" * (64 * 1024)
    response = _post(server, "/v1/completions", content=chunks(), headers={"Content-Type": "application/json"})
    _error(response, 413)
    _still_serving(server)


def test_audio_on_a_text_model_is_refused(server):
    response = _post(server, "/v1/audio/transcriptions", files={"file": ("a.wav", b"RIFF")}, data={"model": MODEL})
    _error(response, 400, "model")


def _metric(server, name):
    text = httpx.get(f"{server.url}/metrics").text
    return float(re.search(rf"^seq2seq_engine:{name}\{{[^}}]*\}} (\S+)$", text, re.M).group(1))


def test_client_disconnecting_mid_stream_frees_its_blocks(server):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Tell me a long story about a dragon."}],
            "max_tokens": 400, "temperature": 0, "stream": True}
    held_during = None
    with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=body, headers=AUTH, timeout=120) as response:
        assert response.status_code == 200
        for number, line in enumerate(response.iter_lines()):
            if number == 6:
                held_during = pool_state(server)
                break
    assert held_during["unfinished"] == 1 and held_during["free"] < held_during["total"]
    state = wait_until_idle(server, timeout=30)
    assert state["unfinished"] == 0 and state["free"] == state["total"] and state["self_tables"] == 0
    deadline = time.monotonic() + 10
    while _metric(server, "kv_cache_usage_perc") != 0.0 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _metric(server, "kv_cache_usage_perc") == 0.0
    assert _metric(server, "kv_cache_free_blocks") == state["total"]
    _still_serving(server)


def test_non_streamed_client_that_times_out_is_aborted(server):
    body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 400, "temperature": 0}
    with pytest.raises(httpx.ReadTimeout):
        _post(server, "/v1/completions", json=body, timeout=1.5)
    state = wait_until_idle(server, timeout=30)
    assert state["unfinished"] == 0 and state["free"] == state["total"]
    assert json.loads(httpx.get(f"{server.url}/v1/models", headers=AUTH).text)["data"][0]["id"] == MODEL
