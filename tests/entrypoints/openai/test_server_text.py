"""The server on SmolLM2-135M-Instruct, driven by the official `openai` client: completions and streamed chat
completions give the tokens of `LLM.generate` on the same prompts and seeds; models, tokenize, X-Request-Id."""
import concurrent.futures
import re
import time

import httpx
import pytest
import transformers
from conftest import require_model
from server_utils import SMALL_POOLS, build_engine, running_server, wait_until_idle

from seq2seq_engine import LLM

openai = pytest.importorskip("openai")
pytestmark = pytest.mark.usefixtures("one_thread")

MODEL = "smollm2-135m"
PROMPTS = ["The capital of France is", "def fibonacci(n):"]
CHAT = [{"role": "system", "content": "You are a terse assistant."},
        {"role": "user", "content": "Name three colours."}]


@pytest.fixture(scope="module")
def model_dir():
    return require_model(MODEL)


@pytest.fixture(scope="module")
def server(model_dir, one_thread):
    with running_server(build_engine(model_dir, max_num_seqs=8), MODEL) as running:
        yield running


@pytest.fixture(scope="module")
def reference(model_dir):
    return LLM(model_dir, max_num_seqs=8, **SMALL_POOLS)


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)


def _chat_token_ids(model_dir):
    """The conversation through transformers' own chat template rendering (the reference for the server's)."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    text = tokenizer.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
    return tokenizer, tokenizer.encode(text, add_special_tokens=False)


def test_models_and_health(server, client):
    assert [model.id for model in client.models.list().data] == [MODEL]
    assert httpx.get(f"{server.url}/health").status_code == 200


def test_greedy_completions_equal_llm_generate(client, reference):
    expected = reference.generate(PROMPTS, {"max_tokens": 12, "temperature": 0.0, "logprobs": 0}, use_tqdm=False)
    response = client.completions.create(model=MODEL, prompt=PROMPTS, max_tokens=12, temperature=0, logprobs=0)
    tokenizer = reference.get_tokenizer()
    assert [choice.index for choice in response.choices] == [0, 1]
    for choice, output in zip(response.choices, expected):
        completion = output.outputs[0]
        assert choice.text == completion.text
        assert choice.finish_reason == completion.finish_reason
        assert choice.logprobs.tokens == [tokenizer.decode([t]) for t in completion.token_ids]
        assert choice.logprobs.token_logprobs == pytest.approx(
            [entry[t] for t, entry in zip(completion.token_ids, completion.logprobs)], abs=1e-4)
    assert response.usage.prompt_tokens == sum(len(o.prompt_token_ids) for o in expected)
    assert response.usage.completion_tokens == sum(len(o.outputs[0].token_ids) for o in expected)
    assert response.usage.total_tokens == response.usage.prompt_tokens + response.usage.completion_tokens


def test_token_id_prompts(client, reference):
    token_ids = reference.get_tokenizer().encode(PROMPTS[0])
    [expected] = reference.generate([{"prompt_token_ids": token_ids}], {"max_tokens": 6, "temperature": 0.0},
                                    use_tqdm=False)
    response = client.completions.create(model=MODEL, prompt=[token_ids, token_ids], max_tokens=6, temperature=0)
    assert [choice.text for choice in response.choices] == [expected.outputs[0].text] * 2


def test_seeded_sampling_equals_llm_generate(client, reference):
    params = {"max_tokens": 10, "temperature": 0.9, "top_p": 0.95, "top_k": 40, "seed": 1234}
    [expected] = reference.generate(PROMPTS[:1], params, use_tqdm=False)
    response = client.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=10, temperature=0.9,
                                         top_p=0.95, seed=1234, extra_body={"top_k": 40})
    assert response.choices[0].text == expected.outputs[0].text
    other = client.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=10, temperature=0.9, top_p=0.95,
                                      seed=1234, extra_body={"top_k": 40})
    assert other.choices[0].text == expected.outputs[0].text


def test_streamed_chat_equals_llm_generate(client, reference, model_dir):
    tokenizer, token_ids = _chat_token_ids(model_dir)
    [expected] = reference.generate([{"prompt_token_ids": token_ids}], {"max_tokens": 16, "temperature": 0.0},
                                    use_tqdm=False)
    stream = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=16, temperature=0, stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    content = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    assert content == expected.outputs[0].text
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == expected.outputs[0].finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage.prompt_tokens == len(token_ids)
    assert chunks[-1].usage.completion_tokens == len(expected.outputs[0].token_ids)
    assert all(chunk.usage is None for chunk in chunks[:-1])


def test_chat_non_streamed_and_concurrent_streams(client, reference, model_dir, server):
    _, token_ids = _chat_token_ids(model_dir)
    [expected] = reference.generate([{"prompt_token_ids": token_ids}], {"max_tokens": 16, "temperature": 0.0},
                                    use_tqdm=False)
    response = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=16, temperature=0)
    assert response.choices[0].message.content == expected.outputs[0].text
    assert response.usage.completion_tokens == len(expected.outputs[0].token_ids)

    def streamed(_):
        stream = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=16, temperature=0,
                                                stream=True)
        return "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)

    with concurrent.futures.ThreadPoolExecutor(4) as pool:  # batched together on the one engine loop
        assert list(pool.map(streamed, range(4))) == [expected.outputs[0].text] * 4
    assert wait_until_idle(server)["free"] == wait_until_idle(server)["total"]


def test_streamed_completion_sse_wire_format_and_request_id(server):
    body = {"model": MODEL, "prompt": PROMPTS[0], "max_tokens": 4, "temperature": 0, "stream": True}
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, headers={"X-Request-Id": "abc-123"},
                      timeout=60) as response:
        assert response.status_code == 200
        assert response.headers["x-request-id"] == "abc-123"
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [line for line in response.iter_lines() if line]
    assert all(line.startswith("data: ") for line in events)
    assert events[-1] == "data: [DONE]" and len(events) >= 3
    assert '"id": "abc-123"' in events[0]


def test_n_best_of_and_beam_search(client, reference):
    response = client.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=5, n=2, seed=7,
                                         temperature=1.0, extra_body={"best_of": 3})
    assert [choice.index for choice in response.choices] == [0, 1]
    [expected] = reference.generate(PROMPTS[:1], {"max_tokens": 5, "beam_width": 3, "length_penalty": 1.0},
                                    use_tqdm=False)
    beams = client.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=5, n=3,
                                      extra_body={"use_beam_search": True, "length_penalty": 1.0})
    assert [choice.text for choice in beams.choices] == [o.text for o in expected.outputs]


def test_tokenize_and_detokenize(server, model_dir):
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    tokens = httpx.post(f"{server.url}/tokenize", json={"model": MODEL, "prompt": "Hello world"}).json()
    assert tokens["tokens"] == tokenizer.encode("Hello world") and tokens["count"] == len(tokens["tokens"])
    text = httpx.post(f"{server.url}/detokenize", json={"model": MODEL, "tokens": tokens["tokens"]}).json()
    assert text["prompt"] == tokenizer.decode(tokens["tokens"])
    chat = httpx.post(f"{server.url}/tokenize", json={"messages": CHAT}).json()
    assert chat["tokens"] == _chat_token_ids(model_dir)[1]


def test_metrics_count_the_served_requests(server, client):
    def sample(name):
        text = httpx.get(f"{server.url}/metrics").text
        return float(re.search(rf"^seq2seq_engine:{name}\{{[^}}]*\}} (\S+)$", text, re.M).group(1))

    before = {name: sample(name) for name in ("generation_tokens_total", "time_to_first_token_seconds_count",
                                              "e2e_request_latency_seconds_count", "prompt_tokens_total")}
    response = client.completions.create(model=MODEL, prompt=PROMPTS, max_tokens=5, temperature=0)
    assert sample("generation_tokens_total") - before["generation_tokens_total"] == response.usage.completion_tokens
    assert sample("prompt_tokens_total") - before["prompt_tokens_total"] == response.usage.prompt_tokens
    assert sample("time_to_first_token_seconds_count") - before["time_to_first_token_seconds_count"] == 2
    assert sample("e2e_request_latency_seconds_count") - before["e2e_request_latency_seconds_count"] == 2
    assert sample("inter_token_latency_seconds_count") > 0
    deadline = time.monotonic() + 5  # the gauges are set after the step that finished the requests
    while (sample("num_requests_running"), sample("kv_cache_usage_perc")) != (0, 0) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (sample("num_requests_running"), sample("kv_cache_usage_perc")) == (0, 0)


def _counter(server, name):
    text = httpx.get(f"{server.url}/metrics").text
    return float(re.search(rf"^seq2seq_engine:{name}_total\{{[^}}]*\}} (\S+)$", text, re.M).group(1))


def _counters_after(server, names, before, expected):
    """The counters' growth since `before`, read again until it is `expected` (they are read from the engine after
    the step that served the request) or 5 s have passed."""
    deadline = time.monotonic() + 5
    while True:
        grown = {name: _counter(server, name) - before[name] for name in names}
        if grown == expected or time.monotonic() > deadline:
            return grown
        time.sleep(0.05)


def test_metrics_count_prefix_cache_hits_of_a_repeated_prompt(server, client):
    names = ("prefix_cache_queries", "prefix_cache_hits", "encoder_cache_queries", "encoder_runs")
    prompt = ("Prefix caching test: the following list names the planets of the solar system in their order from "
              "the sun, each with one fact about it, starting with Mercury, the smallest one, then")
    before = {name: _counter(server, name) for name in names}
    first = client.completions.create(model=MODEL, prompt=prompt, max_tokens=2, temperature=0)
    num_tokens = first.usage.prompt_tokens
    assert num_tokens > 2 * 16  # longer than two blocks of the default block size
    expected = {"prefix_cache_queries": num_tokens, "prefix_cache_hits": 0, "encoder_cache_queries": 0,
                "encoder_runs": 0}
    assert _counters_after(server, names, before, expected) == expected
    second = client.completions.create(model=MODEL, prompt=prompt, max_tokens=2, temperature=0)
    assert second.choices[0].text == first.choices[0].text
    # Every full block before the one holding the last prompt token (whose logits are sampled) is found again.
    expected.update(prefix_cache_queries=2 * num_tokens, prefix_cache_hits=(num_tokens - 1) // 16 * 16)
    assert _counters_after(server, names, before, expected) == expected
