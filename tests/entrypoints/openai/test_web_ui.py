"""The browser page at / in Debian's chromium (Playwright) on a real server of whisper-tiny.en and a tiny Llama."""
import argparse
import dataclasses
import re

import httpx
import pytest
from browser_utils import chromium, microphone_wav, missing_browser
from conftest import require_model
from realtime_utils import clip_path
from server_utils import API_KEY, running_models, tiny_chat_llama
from starlette.testclient import TestClient

from seq2seq_engine.entrypoints.openai import serve_cli
from seq2seq_engine.entrypoints.openai.app import build_app

srt = pytest.importorskip("srt")
websockets = pytest.importorskip("websockets")
pytestmark = pytest.mark.usefixtures("one_thread")

WHISPER, TEXT = "whisper-tiny.en", "tiny-llama"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
TIMEOUT_MS = 60_000
NUMBERS = ["one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"]


def _args(*argv):
    return serve_cli.configure_parser(argparse.ArgumentParser()).parse_args(list(argv))


@pytest.fixture(scope="module")
def server(tmp_path_factory, spm_tokenizer, one_thread):
    """`serve whisper-tiny.en <tiny Llama>` with an API key, built by the serve command's own code."""
    root = tmp_path_factory.mktemp("web_ui")
    llama_dir, _ = tiny_chat_llama(root, spm_tokenizer)
    args = _args(require_model(WHISPER), llama_dir, "--served-model-name", WHISPER, TEXT, "--api-key", API_KEY,
                 "--kv-cache-space-gb", "0.3", "--swap-space-gb", "0.01", "--max-num-seqs", "8")
    engines, settings, _ = serve_cli.build(args)
    assert settings.ui and settings.api_key == API_KEY
    with running_models(engines, api_key=API_KEY) as running:
        yield running


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    """Headless chromium; the tests in a browser skip, naming what is missing, where it or Playwright is not
    installed (the others still run)."""
    if missing_browser():
        pytest.skip(missing_browser())
    wav = microphone_wav(clip_path("counting"), str(tmp_path_factory.mktemp("microphone") / "counting.wav"))
    with chromium(wav) as running:
        yield running


@pytest.fixture
def page(browser, server):
    context = browser.new_context(accept_downloads=True)
    page = context.new_page()
    page.set_default_timeout(TIMEOUT_MS)
    page.goto(server.url)
    yield page
    context.close()


def _connect(page, key=API_KEY):
    page.fill("#api-key", key)
    page.click("#connect")


def _connected(page):
    _connect(page)
    page.wait_for_selector("#file-section fieldset:not([disabled])")


def _finished(page, section):
    """Wait until the section's status says Done or its error shows; fail with the error's text."""
    page.wait_for_selector(f"#{section}-status:has-text('Done'), #{section}-error:not([hidden])")
    assert page.locator(f"#{section}-error").is_hidden(), page.inner_text(f"#{section}-error")


def _counting(text):
    """The numbers counting.wav says, as digits ("One, two, ... 10." and "1, 2, 345" alike: 12345...)."""
    words = re.findall(r"\w+", text.lower())
    return "".join(str(NUMBERS.index(word) + 1) if word in NUMBERS else word for word in words)


def test_the_page_is_public_and_the_api_needs_the_key(server):
    page = httpx.get(f"{server.url}/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "default-src 'self'" in page.headers["content-security-policy"]
    script = httpx.get(f"{server.url}/ui/app.js")
    assert script.status_code == 200 and "javascript" in script.headers["content-type"]
    assert httpx.post(f"{server.url}/").status_code == 401  # only GET and HEAD are open
    missing = httpx.get(f"{server.url}/v1/models")
    assert missing.status_code == 401 and missing.json()["error"]["code"] == "invalid_api_key"
    cards = httpx.get(f"{server.url}/v1/models", headers=AUTH).json()["data"]
    assert {card["id"]: card["kind"] for card in cards} == {WHISPER: "audio", TEXT: "text"}


def test_realtime_takes_the_key_as_a_subprotocol(server):
    from websockets.sync.client import connect

    url = f"{server.url.replace('http://', 'ws://')}/v1/realtime?intent=transcription"
    with connect(url, subprotocols=["realtime", f"openai-insecure-api-key.{API_KEY}"], open_timeout=30) as socket:
        assert socket.subprotocol == "realtime"
        assert '"session.created"' in socket.recv(timeout=30)
    with pytest.raises(websockets.exceptions.InvalidStatus):
        connect(url, subprotocols=["realtime", "openai-insecure-api-key.wrong"], open_timeout=30)


def test_without_the_ui_the_page_is_gone(server):
    assert serve_cli.server_settings(_args("m")).ui
    settings = serve_cli.server_settings(_args("m", "--no-ui", "--api-key", API_KEY))
    assert not settings.ui
    client = TestClient(build_app(dataclasses.replace(server.models, settings=settings)))
    assert [client.get(path, headers=AUTH).status_code for path in ("/", "/ui/app.js")] == [404, 404]
    assert client.get("/").status_code == 401  # as any unknown path without the key


def test_a_wrong_key_shows_the_servers_401_message(page):
    _connect(page, "wrong")
    error = page.locator("#key-error")
    error.wait_for(state="visible")
    message = httpx.get(f"{page.url}v1/models", headers={"Authorization": "Bearer wrong"}).json()["error"]["message"]
    assert error.inner_text() == message and "API key" in message
    assert page.evaluate("[sessionStorage.getItem('seq2seq-engine.api-key'), localStorage.length]") == ["wrong", 0]
    assert page.locator("#text-run").is_disabled() and page.locator("#file-run").is_disabled()


def test_an_upload_streams_its_segments_and_downloads_the_servers_srt(page, server):
    _connected(page)
    assert page.locator("#file-model option").all_inner_texts() == [WHISPER]
    page.set_input_files("#file-input", clip_path("counting"))
    page.click("#file-run")
    _finished(page, "file")
    times = page.locator("#segments .time").all_inner_texts()
    assert times and re.fullmatch(r"00:00\.00 → 00:0\d\.\d\d", times[0])
    assert _counting(" ".join(page.locator("#segments .text").all_inner_texts())).startswith("12345")
    with page.expect_download() as download:
        page.click(".downloads button[data-format=srt]")
    assert download.value.suggested_filename == "counting.srt"
    text = open(download.value.path(), encoding="utf-8").read()
    assert _counting(" ".join(sub.content for sub in srt.parse(text))).startswith("12345")
    with open(clip_path("counting"), "rb") as handle:
        expected = httpx.post(f"{server.url}/v1/audio/transcriptions", headers=AUTH, timeout=120,
                              files={"file": handle}, data={"model": WHISPER, "response_format": "srt"}).text
    assert text == expected


def test_the_microphone_gets_live_captions(page):
    _connected(page)
    page.click("#live-start")
    final = page.locator("#captions p.final").first
    final.wait_for()
    assert _counting(final.inner_text()).startswith("12345")
    page.click("#live-stop")
    page.wait_for_selector("#live-start:not([disabled])")
    assert page.locator("#live-error").is_hidden()


@pytest.mark.parametrize("mode", ["completion", "chat"])
def test_the_prompt_box_streams_what_the_api_gives(page, server, mode):
    _connected(page)
    page.select_option("#text-mode", mode)
    page.fill("#text-max-tokens", "8")
    page.fill("#text-temperature", "0")
    page.fill("#prompt", "the quick brown fox")
    page.click("#text-run")
    _finished(page, "text")
    body = {"model": TEXT, "max_tokens": 8, "temperature": 0}
    if mode == "chat":
        answer = httpx.post(f"{server.url}/v1/chat/completions", headers=AUTH, timeout=60, json={
            **body, "messages": [{"role": "user", "content": "the quick brown fox"}]}).json()
        expected = answer["choices"][0]["message"]["content"]
    else:
        answer = httpx.post(f"{server.url}/v1/completions", headers=AUTH, timeout=60,
                            json={**body, "prompt": "the quick brown fox"}).json()
        expected = answer["choices"][0]["text"]
    assert expected and page.text_content("#text-output") == expected
    assert int(re.search(r"(\d+) chunks", page.inner_text("#text-status")).group(1)) > 1


def test_a_section_without_a_model_of_its_kind_says_so(page):
    page.route("**/v1/models", lambda route: route.fulfill(json={"object": "list", "data": [
        {"id": TEXT, "object": "model", "kind": "text", "parent": None}]}))
    _connect(page)
    page.wait_for_selector("#text-section fieldset:not([disabled])")
    for section in ("#file-section", "#live-section"):
        assert page.locator(f"{section} button").first.is_disabled()
        assert "no Whisper (audio) model" in page.inner_text(f"{section} .notice")
    assert page.locator("#text-section .notice").is_hidden()
