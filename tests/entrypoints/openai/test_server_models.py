"""One server for two models (SmolLM2-135M-Instruct and Whisper tiny.en), driven by the official `openai` client:
both listed, each request runs on the model it names and gives what that model gives offline, unknown or missing
names get 4xx, /metrics carries both models, and every block of both pools is free afterwards."""
import argparse
import concurrent.futures
import os
import re

import httpx
import pytest
from conftest import require_model, require_speech_clips
from server_utils import SMALL_POOLS, build_engine, running_models, wait_until_idle

from seq2seq_engine import LLM
from seq2seq_engine.entrypoints.openai import serve_cli

openai = pytest.importorskip("openai")
pytestmark = pytest.mark.usefixtures("one_thread")

TEXT, AUDIO = "smollm2-135m", "whisper-tiny.en"
PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def model_dirs():
    return {TEXT: require_model(TEXT), AUDIO: require_model(AUDIO)}


@pytest.fixture(scope="module")
def clip():
    return os.path.join(require_speech_clips(), "en", "quick_brown_fox.wav")


@pytest.fixture(scope="module")
def server(model_dirs, one_thread):
    engines = {name: build_engine(path, max_num_seqs=8) for name, path in model_dirs.items()}
    with running_models(engines) as running:
        yield running


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=300)


def test_both_models_listed_and_healthy(server, client):
    assert [model.id for model in client.models.list().data] == [TEXT, AUDIO]
    assert httpx.get(f"{server.url}/health").status_code == 200


def test_each_request_runs_on_the_model_it_names(client, model_dirs, clip):
    expected_text = LLM(model_dirs[TEXT], max_num_seqs=8, **SMALL_POOLS).generate(
        [PROMPT], {"max_tokens": 16, "temperature": 0.0}, use_tqdm=False)[0].outputs[0].text
    [expected_audio] = LLM(model_dirs[AUDIO], max_num_seqs=8, **SMALL_POOLS).transcribe(clip, use_tqdm=False)

    def transcribe():
        with open(clip, "rb") as handle:
            return client.audio.transcriptions.create(model=AUDIO, file=handle).text

    with concurrent.futures.ThreadPoolExecutor(2) as pool:  # both engine loops busy at once
        audio = pool.submit(transcribe)
        text = pool.submit(lambda: client.completions.create(model=TEXT, prompt=PROMPT, max_tokens=16,
                                                             temperature=0).choices[0].text)
        assert text.result() == expected_text
        assert audio.result() == expected_audio.text and "fox" in expected_audio.text.lower()


def test_unknown_missing_and_wrong_kind_of_model(server, client, clip):
    with pytest.raises(openai.NotFoundError) as caught:
        client.completions.create(model="no-such-model", prompt=PROMPT, max_tokens=2)
    assert caught.value.body["code"] == "model_not_found" and TEXT in caught.value.body["message"]
    missing = httpx.post(f"{server.url}/v1/completions", json={"prompt": PROMPT, "max_tokens": 2})
    assert missing.status_code == 400 and missing.json()["error"]["param"] == "model"
    with open(clip, "rb") as handle, pytest.raises(openai.BadRequestError) as caught:
        client.audio.transcriptions.create(model=TEXT, file=handle)
    assert "takes no audio" in caught.value.body["message"]


def test_metrics_carry_both_models_and_every_block_comes_back(server, client):
    client.completions.create(model=TEXT, prompt=PROMPT, max_tokens=3, temperature=0)
    text = httpx.get(f"{server.url}/metrics").text
    for name in (TEXT, AUDIO):
        assert re.search(rf'^seq2seq_engine:kv_cache_total_blocks\{{model_name="{re.escape(name)}"\}} [1-9]', text,
                         re.M)
        state = wait_until_idle(server, name)
        assert state["unfinished"] == 0 and state["free"] == state["total"] and state["cross_tables"] == 0


@pytest.mark.parametrize("argv, message", [
    (["a", "b", "--served-model-name", "x"], "one name per MODEL"),
    (["a", "a"], "its own name"),
])
def test_serve_refuses_names_that_do_not_match_the_models(argv, message, capsys):
    args = serve_cli.configure_parser(argparse.ArgumentParser()).parse_args(argv)
    assert serve_cli.run(args) == serve_cli.EXIT_USAGE
    assert message in capsys.readouterr().err


def test_a_completion_sent_to_the_whisper_model_fails_alone(server, client, clip):
    """A text completion for the Whisper model is refused up front with a 400; the transcriptions in flight on the
    same engine all finish with their text."""
    def transcribe():
        with open(clip, "rb") as handle:
            return client.audio.transcriptions.create(model=AUDIO, file=handle).text

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        transcriptions = [pool.submit(transcribe) for _ in range(3)]
        with pytest.raises(openai.BadRequestError) as caught:
            client.completions.create(model=AUDIO, prompt=PROMPT, max_tokens=4)
        texts = [future.result() for future in transcriptions]
    assert "transcribes audio" in caught.value.body["message"]
    assert all("fox" in text.lower() for text in texts) and len(set(texts)) == 1
    state = wait_until_idle(server, AUDIO)
    assert state["unfinished"] == 0 and state["free"] == state["total"]
