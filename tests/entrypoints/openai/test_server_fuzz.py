"""Fuzzed request bodies for /v1/completions and /v1/chat/completions on a real server (SmolLM2): random types and
values for every known field (NaN, infinities, huge and negative integers, wrong types, unknown fields) get a 2xx
or a 4xx with an OpenAI error body, never a 5xx; the engine keeps serving and its KV pool ends empty."""
import json

import httpx
import pytest
from conftest import require_model
from hypothesis import HealthCheck, given, settings, strategies as st
from server_utils import build_engine, running_server, wait_until_idle

pytestmark = pytest.mark.usefixtures("one_thread")

MODEL = "smollm2-135m"
VOCAB_SIZE = 49152
MAX_EXAMPLES = 40  # per endpoint: both together run in 20 to 40 s on one thread

_HUGE = st.sampled_from([2 ** 31, 2 ** 63 - 1, 2 ** 63, 2 ** 64, 2 ** 70, -2 ** 63, -2 ** 70])
# no subnormals: the native kernels set flush-to-zero in this process, which hypothesis refuses to draw under
_FLOATS = st.floats(allow_nan=True, allow_infinity=True, allow_subnormal=False)
_ANY = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), _HUGE, _FLOATS, st.text(max_size=4),
                 st.lists(st.integers(-2, 3), max_size=2), st.dictionaries(st.text(max_size=2), st.integers(),
                                                                           max_size=1))


def _or_any(strategy):
    """Mostly `strategy`, else anything (one_of would flatten _ANY's branches and draw them most of the time)."""
    return st.integers(0, 7).flatmap(lambda pick: _ANY if pick == 0 else strategy)


_INT = _or_any(st.one_of(st.integers(-2, 4), _HUGE))
_FLOAT = _or_any(st.one_of(st.sampled_from([0.0, 0.5, 1.0, 2.0, -1.0, 1e-300, 1e39, 1e300, -1e300]), _FLOATS))
_BOOL = _or_any(st.booleans())
_TOKENS = _or_any(st.lists(st.integers(0, VOCAB_SIZE - 1), min_size=1, max_size=3)
                  | st.lists(st.integers(-1, VOCAB_SIZE + 10) | _HUGE, max_size=3))
_TEXT = st.sampled_from(["Hi", "The capital of France is", " ", "\n\n"])  # _ANY draws "" and odd text
_SAMPLING = {
    "max_tokens": _or_any(st.integers(-1, 4)), "temperature": _FLOAT, "top_p": _FLOAT, "n": _or_any(st.integers(0, 3)),
    "stop": _or_any(st.one_of(_TEXT, st.lists(_TEXT, max_size=2))), "seed": _INT, "presence_penalty": _FLOAT,
    "frequency_penalty": _FLOAT, "logit_bias": _or_any(st.dictionaries(
        st.sampled_from(["5", "-1", "x", str(2 ** 70)]), _FLOAT, max_size=2)),
    "stream": _BOOL, "stream_options": _or_any(st.fixed_dictionaries({"include_usage": _BOOL})),
    "user": _or_any(_TEXT), "best_of": _or_any(st.integers(0, 4)), "top_k": _INT, "min_p": _FLOAT,
    "repetition_penalty": _FLOAT, "min_tokens": _INT, "ignore_eos": _BOOL, "stop_token_ids": _TOKENS,
    "skip_special_tokens": _BOOL, "include_stop_str_in_output": _BOOL, "no_repeat_ngram_size": _INT,
    "bad_words": _or_any(st.lists(_TEXT, max_size=2)), "allowed_token_ids": _TOKENS, "use_beam_search": _BOOL,
    "length_penalty": _FLOAT, "early_stopping": _or_any(st.sampled_from([True, False, "never"])),
    "frobnicate": _ANY,
}
_MODEL = _or_any(st.just(MODEL))
_MESSAGE = st.fixed_dictionaries({"role": _or_any(st.sampled_from(["system", "user", "assistant"])),
                                  "content": _or_any(_TEXT)})
_MODES = [{}, {"use_beam_search": True, "n": 2}, {"n": 2, "temperature": 1.0}, {"stream": True}]


@st.composite
def _bodies(draw, required, optional):
    """The required fields, a mode (beam search, several samples, streamed or none) and up to five optional fields
    (more would almost always hold one refused value)."""
    body = {**draw(st.fixed_dictionaries(required)), **draw(st.sampled_from(_MODES))}
    for name in draw(st.lists(st.sampled_from(sorted(optional)), max_size=5, unique=True)):
        body[name] = draw(optional[name])
    return body


_PROMPT = _or_any(st.one_of(_TEXT, st.lists(_TEXT, min_size=1, max_size=2), _TOKENS))
_COMPLETION = _bodies({"model": _MODEL, "prompt": _PROMPT},
                      {**_SAMPLING, "logprobs": _INT, "echo": _BOOL, "suffix": _or_any(_TEXT),
                       "decoder_prompt": _ANY})
_CHAT = _bodies({"model": _MODEL, "messages": _or_any(st.lists(_MESSAGE, min_size=1, max_size=2))},
                {**_SAMPLING, "max_completion_tokens": _or_any(st.integers(-1, 4)), "logprobs": _BOOL,
                 "top_logprobs": _INT, "add_generation_prompt": _BOOL})


@pytest.fixture(scope="module")
def server(one_thread):
    engine = build_engine(require_model(MODEL), max_num_seqs=4, max_model_len=64)
    with running_server(engine, MODEL) as run:
        yield run


def _check(server, path, body):
    # json.dumps writes NaN and Infinity literals, which Python's json module (and so the server) reads back
    content = json.dumps(body).encode()
    response = httpx.post(f"{server.url}{path}", content=content, headers={"Content-Type": "application/json"},
                          timeout=120)
    assert response.status_code < 500, (body, response.text)
    if response.status_code >= 400:
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["message"], (body, error)
    elif body.get("stream") is True:
        assert "data: [DONE]" in response.text, (body, response.text)
        assert '"error"' not in response.text, (body, response.text)
    assert server.models.alive
    return response.status_code


@pytest.mark.parametrize("path, bodies", [("/v1/completions", _COMPLETION), ("/v1/chat/completions", _CHAT)])
def test_fuzzed_bodies_get_2xx_or_4xx_and_free_the_pool(server, path, bodies):
    statuses = []

    @settings(max_examples=MAX_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
    @given(body=bodies)
    def run(body):
        statuses.append(_check(server, path, body))

    run()
    assert any(status < 300 for status in statuses), statuses  # some bodies reached the engine
    state = wait_until_idle(server)
    assert state["unfinished"] == 0 and state["free"] == state["total"] and state["self_tables"] == 0
