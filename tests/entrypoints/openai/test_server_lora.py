"""LoRA adapters through the server (`serve --enable-lora --max-loras 2 --lora-modules ...` over a tiny random Llama
and whisper-tiny.en), driven by the official `openai` client: adapters listed with their parent; requests naming an
adapter (completions, chat streamed or not, transcriptions, realtime sessions), concurrent with the base model's, get
what the engine gives for that adapter alone (which is PEFT's); adapters loaded and unloaded at run time."""
import argparse
import concurrent.futures
import json
import threading
import time

import httpx
import pytest
from conftest import require_model
from hf_reference import hf_greedy
from lora.lora_reference import save_random_adapter, whisper_adapter
from realtime_utils import chunks, clip_path, connect, pcm16, recv_until, send, speech, transcription_update
from server_utils import running_models, tiny_chat_llama, wait_until_idle

from seq2seq_engine import LLM, LoRARequest
from seq2seq_engine.entrypoints.openai import serve_cli

openai = pytest.importorskip("openai")
pytestmark = pytest.mark.usefixtures("one_thread")

PROMPTS = ["the quick brown fox", "hello world"]
CHAT = [{"role": "user", "content": "the lazy dog"}]
GREEDY = {"max_tokens": 8, "temperature": 0.0}
IDS = {"a": 1, "b": 2, "c": 3}  # the reference engine's ids (the server gives its own)


@pytest.fixture(scope="module")
def llama(tmp_path_factory, spm_tokenizer):
    """(model dir with a tokenizer and a chat template, {name: (adapter dir, PeftModel)}) for adapters a, b, c."""
    root = tmp_path_factory.mktemp("lora_server")
    model_dir, hf_model = tiny_chat_llama(root, spm_tokenizer)
    adapters = {name: save_random_adapter(hf_model, root / name, 8, ["q_proj", "v_proj", "down_proj"], seed=40 + i,
                                          b_scale=4.0) for i, name in enumerate(IDS)}
    return model_dir, adapters


@pytest.fixture(scope="module")
def whisper(tmp_path_factory):
    model_dir = require_model("whisper-tiny.en")
    return model_dir, whisper_adapter(model_dir, tmp_path_factory.mktemp("lora_whisper") / "w")


def _serve_args(argv):
    return serve_cli.configure_parser(argparse.ArgumentParser()).parse_args(argv)


@pytest.fixture(scope="module")
def server(llama, whisper):
    (llama_dir, adapters), (whisper_dir, whisper_adapter) = llama, whisper
    args = _serve_args([llama_dir, whisper_dir, "--served-model-name", "llama", "whisper", "--enable-lora",
                        "--max-loras", "2", "--lora-modules", f"a={adapters['a'][0]}", f"b={adapters['b'][0]}",
                        json.dumps({"name": "w", "path": whisper_adapter, "base_model_name": "whisper"}),
                        "--allow-runtime-lora-updating", "--kv-cache-space-gb", "0.3", "--swap-space-gb", "0.01",
                        "--max-num-seqs", "8"])
    engines, settings, loras = serve_cli.build(args)
    assert settings.allow_runtime_lora_updating
    with running_models(engines, loras, allow_runtime_lora_updating=True) as running:
        yield running


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def reference(llama):
    return LLM(llama[0], enable_lora=True, max_loras=2, kv_cache_space_gb=0.05)


def _adapter(llama, name):
    return None if name == "llama" else LoRARequest(name, IDS[name], llama[1][name][0])


def _texts(reference, llama, name, prompts):
    outputs = reference.generate(prompts, {**GREEDY, "ignore_eos": True}, use_tqdm=False,
                                 lora_request=_adapter(llama, name))
    return [output.outputs[0].text for output in outputs]


def _chat_ids(reference):
    tokenizer = reference.get_tokenizer()
    text = tokenizer.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
    return {"prompt_token_ids": tokenizer.encode(text, add_special_tokens=False)}


def test_models_lists_each_adapter_with_its_parent(client, llama, whisper):
    cards = {card.id: card.model_dump() for card in client.models.list().data}
    assert list(cards) == ["llama", "whisper", "a", "b", "w"]
    assert (cards["llama"]["parent"], cards["llama"]["root"]) == (None, llama[0])
    assert (cards["a"]["parent"], cards["a"]["root"]) == ("llama", llama[1]["a"][0])
    assert (cards["w"]["parent"], cards["w"]["root"]) == ("whisper", whisper[1])


def test_base_and_adapters_at_once_each_get_their_own_text(server, client, reference, llama):
    targets = ["llama", "a", "b"]
    expected = {name: _texts(reference, llama, name, PROMPTS) for name in targets}
    chat_expected = {name: _texts(reference, llama, name, [_chat_ids(reference)])[0] for name in targets}
    assert len({tuple(texts) for texts in expected.values()}) == 3  # each adapter changes the text
    extra = {"extra_body": {"ignore_eos": True}, **GREEDY}

    def completion(name):
        response = client.completions.create(model=name, prompt=PROMPTS, **extra)
        return response.model, [choice.text for choice in response.choices]

    def chat(name):
        response = client.chat.completions.create(model=name, messages=CHAT, **extra)
        return response.model, response.choices[0].message.content

    def chat_stream(name):
        chunks = list(client.chat.completions.create(model=name, messages=CHAT, stream=True, **extra))
        return chunks[0].model, "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)

    with concurrent.futures.ThreadPoolExecutor(9) as pool:
        futures = {(kind.__name__, name): pool.submit(kind, name) for kind in (completion, chat, chat_stream)
                   for name in targets}
        for (kind, name), future in futures.items():
            model, text = future.result()
            assert model == name
            assert text == (expected[name] if kind == "completion" else chat_expected[name]), (kind, name)
    assert wait_until_idle(server, "llama")["unfinished"] == 0


def test_the_engine_gives_peft_greedy_tokens_for_an_adapter(reference, llama):
    [output] = reference.generate([PROMPTS[0]], {**GREEDY, "ignore_eos": True}, use_tqdm=False,
                                  lora_request=_adapter(llama, "a"))
    peft_model = llama[1]["a"][1]
    assert output.outputs[0].token_ids == hf_greedy(peft_model, None, output.prompt_token_ids, 8)[0]


def _post(server, route, body):
    return httpx.post(f"{server.url}/v1/{route}", json=body, timeout=60)


def _wait_for(condition, timeout=30):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def _unload_behind_a_queued_request(server, client, name):
    """(unload response, completion text): the engine loop is held while a completion on `name` and then the
    unload are queued in its inbox, so the engine holds the request when the unload reaches it."""
    loop = server.models.resolve(name).loop
    gate = threading.Event()
    blocked = loop.call(lambda engine: gate.wait(60))
    inbox = loop._inbox
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        _wait_for(lambda: inbox.qsize() == 0)
        completion = pool.submit(client.completions.create, model=name, prompt=PROMPTS[0], **GREEDY)
        _wait_for(lambda: inbox.qsize() == 1)
        unload = pool.submit(_post, server, "unload_lora_adapter", {"lora_name": name})
        _wait_for(lambda: inbox.qsize() == 2)
        gate.set()
        refused, text = unload.result(), completion.result().choices[0].text
    assert blocked.result() is True
    return refused, text


def test_adapters_load_and_unload_at_run_time(server, client, reference, llama):
    path = llama[1]["c"][0]
    loaded = _post(server, "load_lora_adapter", {"lora_name": "c", "lora_path": path})
    assert loaded.status_code == 200 and "'c'" in loaded.text
    card = next(card for card in client.models.list().data if card.id == "c")
    assert card.model_dump()["parent"] == "llama"
    response = client.completions.create(model="c", prompt=PROMPTS[0], extra_body={"ignore_eos": True}, **GREEDY)
    assert (response.model, response.choices[0].text) == ("c", _texts(reference, llama, "c", PROMPTS[:1])[0])
    for name in ("c", "llama"):  # a name served already
        again = _post(server, "load_lora_adapter", {"lora_name": name, "lora_path": path})
        assert again.status_code == 400 and again.json()["error"]["param"] == "lora_name"
    refused, text = _unload_behind_a_queued_request(server, client, "c")
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "lora_adapter_in_use", refused.text
    assert text and wait_until_idle(server, "llama")["unfinished"] == 0
    assert _post(server, "unload_lora_adapter", {"lora_name": "c"}).status_code == 200
    with pytest.raises(openai.NotFoundError) as caught:
        client.completions.create(model="c", prompt=PROMPTS[0], max_tokens=2)
    assert caught.value.body["code"] == "model_not_found"
    gone = _post(server, "unload_lora_adapter", {"lora_name": "c"})
    assert gone.status_code == 404 and gone.json()["error"]["param"] == "lora_name"
    reloaded = _post(server, "load_lora_adapter", {"lora_name": "c2", "lora_path": path})
    assert reloaded.status_code == 200
    assert _post(server, "unload_lora_adapter", {"lora_int_id": 5}).status_code == 200  # a, b, w, c: 1-4


def test_adapters_that_cannot_be_loaded_are_4xx_naming_them(server, client, llama, tmp_path):
    malformed = tmp_path / "malformed"
    malformed.mkdir()
    (malformed / "adapter_config.json").write_text("{not json")
    cases = [({"lora_name": "m", "lora_path": str(tmp_path / "nothing")}, 400, "lora_path", "no such directory"),
             ({"lora_name": "m", "lora_path": str(malformed)}, 400, "lora_path", "adapter_config.json"),
             ({"lora_name": "m", "lora_path": llama[1]["a"][0], "base_model_name": "whisper"}, 400, "lora_path",
              "cannot be adapted"),
             ({"lora_name": "m", "lora_path": llama[1]["a"][0], "base_model_name": "nope"}, 404, "base_model_name",
              "not served"),
             ({"lora_name": "m" * 5000, "lora_path": llama[1]["a"][0]}, 400, "lora_name", "4096"),
             ({"lora_name": "m", "lora_path": "x" * 5000}, 400, "lora_path", "4096"),
             ({"lora_name": "m", "lora_path": "/x", "load_inplace": True}, 400, "load_inplace", "unknown field")]
    for body, status, param, message in cases:
        response = _post(server, "load_lora_adapter", body)
        error = response.json()["error"]
        assert (response.status_code, error["param"]) == (status, param), response.text
        assert message in error["message"]
    assert "no such directory" in _post(server, "load_lora_adapter", cases[0][0]).json()["error"]["message"]
    assert str(tmp_path / "nothing") in _post(server, "load_lora_adapter", cases[0][0]).json()["error"]["message"]
    assert _post(server, "unload_lora_adapter", {}).status_code == 400
    assert "m" not in [card.id for card in client.models.list().data]


def test_a_transcription_runs_with_the_adapter_it_names(client, whisper):
    model_dir, path = whisper
    clip = clip_path("quick_brown_fox")
    llm = LLM(model_dir, enable_lora=True, kv_cache_space_gb=0.3, swap_space_gb=0.01)
    [adapted] = llm.transcribe(clip, use_tqdm=False, lora_request=LoRARequest("w", 1, path))
    [base] = llm.transcribe(clip, use_tqdm=False)
    assert adapted.text != base.text
    served = {}
    for model in ("w", "whisper"):
        with open(clip, "rb") as handle:
            served[model] = client.audio.transcriptions.create(model=model, file=handle).text
    assert served == {"w": adapted.text, "whisper": base.text}
    with open(clip, "rb") as handle:
        events = list(client.audio.transcriptions.create(model="w", file=handle, stream=True))
    assert events[-1].type == "transcript.text.done" and events[-1].text == adapted.text


def _realtime_transcript(server, model, while_open=None):
    with connect(server, f"intent=transcription&model={model}") as ws:
        created = recv_until(ws, "session.created")[-1]
        assert created["session"]["audio"]["input"]["transcription"]["model"] == model
        if while_open is not None:
            while_open()
        send(ws, transcription_update(turn_detection=None))
        recv_until(ws, "session.updated")
        for piece in chunks(pcm16(speech("quick_brown_fox")), 16000):
            send(ws, {"type": "input_audio_buffer.append", "audio": piece})
        send(ws, {"type": "input_audio_buffer.commit"})
        return recv_until(ws, "conversation.item.input_audio_transcription.completed")[-1]["transcript"]


def test_a_realtime_session_on_an_adapter_holds_it(server, client):
    """Runs last: it unloads w."""
    def refused_while_open():
        response = _post(server, "unload_lora_adapter", {"lora_name": "w"})
        assert response.status_code == 400 and response.json()["error"]["code"] == "lora_adapter_in_use"

    adapted = _realtime_transcript(server, "w", refused_while_open)
    assert adapted != _realtime_transcript(server, "whisper")
    _wait_for(lambda: _post(server, "unload_lora_adapter", {"lora_name": "w"}).status_code == 200)
    assert "w" not in [card.id for card in client.models.list().data]
