"""Request validation of the server (SmolLM2, with an API key): every route but /health and /metrics needs the key,
/tokenize and the text prompts are bounded, and every non-finite float, out-of-range integer or wrong type is a 400
whose `param` names the field; the pool is empty afterwards."""
import httpx
import pytest
from conftest import require_model
from fastapi.routing import APIRoute
from server_utils import API_KEY, build_engine, running_server, wait_until_idle

pytestmark = pytest.mark.usefixtures("one_thread")

MODEL = "smollm2-135m"
MAX_MODEL_LEN = 256
AUTH = {"Authorization": f"Bearer {API_KEY}"}
OPEN_ROUTES = {"/health", "/metrics"}
CHAT = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def server(one_thread):
    engine = build_engine(require_model(MODEL), max_num_seqs=4, max_model_len=MAX_MODEL_LEN)
    with running_server(engine, MODEL, api_key=API_KEY) as run:
        yield run
        state = wait_until_idle(run)
        assert state["unfinished"] == 0 and state["free"] == state["total"]


def _post(server, path, body=None, content=None):
    headers = {**AUTH, "Content-Type": "application/json"}
    return httpx.post(f"{server.url}{path}", json=body, content=content, headers=headers, timeout=120)


def _error(response, status=400):
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]


def test_every_route_but_health_and_metrics_needs_the_key(server):
    routes = [route for route in server.server.config.app.routes if isinstance(route, APIRoute)]
    assert {"/tokenize", "/detokenize", "/v1/models", "/v1/completions"} <= {route.path for route in routes}
    for route in routes:
        for method in route.methods:
            response = httpx.request(method, f"{server.url}{route.path}", json={}, timeout=30)
            if route.path in OPEN_ROUTES:
                assert response.status_code == 200, (method, route.path)
            else:
                assert _error(response, 401)["code"] == "invalid_api_key", (method, route.path)
    _error(httpx.get(f"{server.url}/no-such-route"), 401)
    assert _post(server, "/tokenize", {"prompt": "Hi"}).json()["count"] == 1


def test_text_prompts_are_bounded(server):
    limit = MAX_MODEL_LEN * 16
    assert _post(server, "/tokenize", {"prompt": "a" * limit}).status_code == 200
    error = _error(_post(server, "/tokenize", {"prompt": "word " * 1_000_000}))
    assert error["param"] == "prompt" and str(limit) in error["message"]
    messages = [{"role": "user", "content": "word " * limit}]
    assert _error(_post(server, "/tokenize", {"messages": messages}))["param"] == "messages"
    assert _error(_post(server, "/v1/chat/completions", {"model": MODEL, "messages": messages}))["param"] == "messages"
    completion = {"model": MODEL, "prompt": ["Hi", "word " * limit]}
    assert _error(_post(server, "/v1/completions", completion))["param"] == "prompt"


SAMPLING_FLOATS = ["temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty"]


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e400", "1e39"])
@pytest.mark.parametrize("name", SAMPLING_FLOATS)
def test_non_finite_floats_are_refused(server, name, literal):
    content = f'{{"model": "{MODEL}", "prompt": "Hi", "max_tokens": 2, "{name}": {literal}}}'
    assert _error(_post(server, "/v1/completions", content=content.encode()))["param"] == name
    chat = f'{{"model": "{MODEL}", "messages": [{{"role": "user", "content": "Hi"}}], "{name}": {literal}}}'
    assert _error(_post(server, "/v1/chat/completions", content=chat.encode()))["param"] == name


def test_non_finite_logit_bias_and_length_penalty_are_refused(server):
    content = f'{{"model": "{MODEL}", "prompt": "Hi", "logit_bias": {{"5": NaN}}}}'
    assert _error(_post(server, "/v1/completions", content=content.encode()))["param"].startswith("logit_bias")
    for value in ("NaN", "Infinity", "1e300"):
        content = f'{{"model": "{MODEL}", "prompt": "Hi", "use_beam_search": true, "n": 2, "length_penalty": {value}}}'
        assert _error(_post(server, "/v1/completions", content=content.encode()))["param"] == "length_penalty"


@pytest.mark.parametrize("field, value", [
    ("seed", 2 ** 70), ("seed", 2 ** 63), ("no_repeat_ngram_size", -1), ("no_repeat_ngram_size", 2 ** 70),
    ("top_k", 2 ** 70), ("max_tokens", 2 ** 70), ("max_tokens", MAX_MODEL_LEN + 1), ("n", 2 ** 70),
    ("best_of", 2 ** 70), ("min_tokens", 2 ** 70), ("logprobs", 2 ** 70), ("stop_token_ids", [2 ** 70]),
    ("allowed_token_ids", [2 ** 70]), ("max_tokens", "abc"), ("seed", 1.5), ("n", True),
])
def test_out_of_range_integers_name_their_field(server, field, value):
    body = {"model": MODEL, "prompt": "Hi", "max_tokens": 2, field: value}
    assert _error(_post(server, "/v1/completions", body))["param"] == field


@pytest.mark.parametrize("field, value", [
    ("max_completion_tokens", 2 ** 70), ("max_tokens", 2 ** 70), ("top_logprobs", 2 ** 70), ("top_logprobs", -1),
    ("n", 0), ("seed", -1), ("max_tokens", "abc"), ("max_completion_tokens", "abc"),
])
def test_chat_integers_name_their_field(server, field, value):
    body = {"model": MODEL, "messages": CHAT, "logprobs": True, field: value}
    assert _error(_post(server, "/v1/chat/completions", body))["param"] == field


def test_beam_search_widths_name_the_field_sent(server):
    body = {"model": MODEL, "prompt": "Hi", "max_tokens": 2, "use_beam_search": True}
    assert _error(_post(server, "/v1/completions", {**body, "n": 2 ** 70}))["param"] == "n"
    assert _error(_post(server, "/v1/completions", {**body, "best_of": 2 ** 70}))["param"] == "best_of"
    greedy = {**body, "n": 2, "temperature": 0.0, "use_beam_search": False}
    assert _error(_post(server, "/v1/completions", greedy))["param"] == "n"


def test_union_fields_are_named_without_their_type_tags(server):
    assert _error(_post(server, "/v1/completions", {"model": MODEL, "prompt": 5}))["param"] == "prompt"
    assert _error(_post(server, "/v1/completions", {"model": MODEL, "prompt": "Hi", "stop": 5}))["param"] == "stop"
    messages = [{"role": "user", "content": 5}]
    assert _error(_post(server, "/v1/chat/completions", {"model": MODEL, "messages": messages}))["param"] == \
        "messages.0.content"
