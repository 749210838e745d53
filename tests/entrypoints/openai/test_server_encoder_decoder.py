"""The server on an encoder/decoder model (a tiny random BART with a real sentencepiece tokenizer): the prompt is
the encoder prompt, `decoder_prompt` the decoder's; outputs equal `LLM.generate` on the same explicit prompt (with
the model's generation_config.json defaults under the fields sent, as in LLM.generate with a dict)."""
import re
import time

import httpx
import pytest
from server_utils import SMALL_POOLS, build_engine, running_server

from seq2seq_engine import LLM

openai = pytest.importorskip("openai")

MODEL = "tiny-bart"
ENCODER_TEXT = "the quick brown fox jumps over lazy dog"


@pytest.fixture(scope="module")
def bart(bart_with_tokenizer):
    model_dir, _, tokenizer = bart_with_tokenizer
    with running_server(build_engine(model_dir, max_num_seqs=4), MODEL) as server:
        yield server, model_dir, tokenizer


def test_decoder_prompt_is_the_decoders_and_matches_hf(bart):
    server, model_dir, tokenizer = bart
    decoder_ids = tokenizer.encode("hello world", add_special_tokens=False)
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    overrides = {"max_tokens": 6, "temperature": 0.0, "ignore_eos": True}
    llm = LLM(model_dir, **SMALL_POOLS)
    [explicit] = llm.generate([{"encoder_prompt": ENCODER_TEXT, "decoder_prompt": {"prompt_token_ids": decoder_ids}}],
                              overrides, use_tqdm=False)
    [plain] = llm.generate([ENCODER_TEXT], overrides, use_tqdm=False)
    assert explicit.prompt_token_ids[-len(decoder_ids):] == decoder_ids

    with_decoder = client.completions.create(model=MODEL, prompt=ENCODER_TEXT, max_tokens=6, temperature=0,
                                             extra_body={"decoder_prompt": decoder_ids, "ignore_eos": True})
    assert with_decoder.choices[0].text == explicit.outputs[0].text
    assert with_decoder.usage.prompt_tokens == len(explicit.prompt_token_ids) + len(explicit.encoder_prompt_token_ids)
    without = client.completions.create(model=MODEL, prompt=ENCODER_TEXT, max_tokens=6, temperature=0,
                                        extra_body={"ignore_eos": True})
    assert without.choices[0].text == plain.outputs[0].text
    assert explicit.prompt_token_ids != plain.prompt_token_ids


def test_chat_needs_a_template(bart):
    server = bart[0]
    response = httpx.post(f"{server.url}/v1/chat/completions", timeout=60,
                          json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]})
    assert response.status_code == 400 and response.json()["error"]["param"] == "messages"


def _counter(server, name):
    text = httpx.get(f"{server.url}/metrics").text
    return float(re.search(rf"^seq2seq_engine:{name}_total\{{[^}}]*\}} (\S+)$", text, re.M).group(1))


def test_metrics_count_one_encoder_run_for_a_repeated_encoder_input(bart):
    server = bart[0]
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    names = ("encoder_cache_queries", "encoder_cache_hits", "encoder_runs")
    before = {name: _counter(server, name) for name in names}
    texts = [client.completions.create(model=MODEL, prompt="a lazy dog sleeps under the old brown tree", max_tokens=4,
                                       temperature=0, extra_body={"ignore_eos": True}).choices[0].text
             for _ in range(2)]
    assert texts[0] == texts[1]
    expected = {"encoder_cache_queries": 2, "encoder_cache_hits": 1, "encoder_runs": 1}
    deadline = time.monotonic() + 5  # the counters are read from the engine after the step that served a request
    grown = {name: _counter(server, name) - before[name] for name in names}
    while grown != expected and time.monotonic() < deadline:
        time.sleep(0.05)
        grown = {name: _counter(server, name) - before[name] for name in names}
    assert grown == expected  # the second request reads the cross table the first one's encoder run wrote
