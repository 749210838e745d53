"""The server's bound on decoded audio (--max-audio-seconds) on Whisper tiny.en: an upload longer than the limit
gets a 413 naming it, quickly and without the server's memory growing with the audio's length, whether its
container declares its duration or the decoder finds it out; shorter audio transcribes."""
import contextlib
import threading
import time

import httpx
import pytest
from conftest import require_model, require_speech_clips
from server_utils import build_engine, running_server, wait_until_idle
from silent_media import silent_file, silent_wav

openai = pytest.importorskip("openai")
pytestmark = pytest.mark.usefixtures("one_thread")

MODEL = "whisper-tiny.en"
LIMIT_S = 60
TEN_MINUTES = 600
FAST_S = 15  # a refusal reads at most the limit's audio (or only the header): well under this
RSS_GROWTH_MB = 200


@pytest.fixture(scope="module")
def model_dir():
    return require_model(MODEL)


@pytest.fixture(scope="module")
def server(model_dir, one_thread):
    with running_server(build_engine(model_dir, max_num_seqs=8), MODEL, max_audio_seconds=LIMIT_S) as running:
        yield running


@pytest.fixture(scope="module")
def declared_opus():
    return silent_file(TEN_MINUTES)  # ogg: FFmpeg finds the duration from the last page


@pytest.fixture(scope="module")
def undeclared_webm():
    return silent_file(TEN_MINUTES, "webm", declare_duration=False)


def _rss_mb() -> float:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:")) / 1024


@contextlib.contextmanager
def peak_rss_growth():
    """{'mb': the most the process's RSS rose above its level at entry, sampled every 10 ms} (the server runs on a
    thread of this process)."""
    base, peak, stop = _rss_mb(), [0.0], threading.Event()

    def sample():
        while not stop.wait(0.01):
            peak[0] = max(peak[0], _rss_mb() - base)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    growth = {"mb": 0.0}
    try:
        yield growth
    finally:
        stop.set()
        thread.join()
        growth["mb"] = max(peak[0], _rss_mb() - base)


def _post(server, data: bytes, name: str, **fields):
    started = time.monotonic()
    with peak_rss_growth() as growth:
        response = httpx.post(f"{server.url}/v1/audio/transcriptions", timeout=FAST_S * 4,
                              files={"file": (name, data)}, data={"model": MODEL, **fields})
    return response, time.monotonic() - started, growth["mb"]


def _assert_refused(response, seconds: float, growth_mb: float, limit: float) -> None:
    print(f"status {response.status_code} after {seconds:.2f} s, peak RSS growth {growth_mb:.1f} MB")
    assert response.status_code == 413, response.text
    error = response.json()["error"]
    assert error["param"] == "file" and error["code"] == "audio_too_long"
    assert f"limit of {limit:g} seconds" in error["message"] and "--max-audio-seconds" in error["message"]
    assert seconds < FAST_S, f"the refusal took {seconds:.1f} s"
    assert growth_mb < RSS_GROWTH_MB, f"the server grew by {growth_mb:.0f} MB"


@pytest.mark.parametrize("fields", [{}, {"vad_filter": "false"}, {"stream": "true"}],
                         ids=["vad-auto", "no-vad", "streamed"])
def test_declared_duration_over_the_limit_gets_413_from_the_header(server, declared_opus, fields):
    response, seconds, growth = _post(server, declared_opus, "silence.ogg", **fields)
    _assert_refused(response, seconds, growth, LIMIT_S)
    assert wait_until_idle(server)["unfinished"] == 0


@pytest.mark.parametrize("fields", [{}, {"vad_filter": "true"}, {"vad_filter": "false"}, {"stream": "true"}],
                         ids=["vad-auto", "vad", "no-vad", "streamed"])
def test_undeclared_duration_over_the_limit_gets_413_once_decoded_past_it(server, undeclared_webm, fields):
    response, seconds, growth = _post(server, undeclared_webm, "silence.webm", **fields)
    _assert_refused(response, seconds, growth, LIMIT_S)
    state = wait_until_idle(server)
    assert state["unfinished"] == 0 and state["free"] == state["total"]


def test_audio_within_the_limit_still_transcribes(server):
    import glob
    import os
    clip = glob.glob(os.path.join(require_speech_clips(), "en", "quick_brown_fox.wav"))[0]
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=300)
    with open(clip, "rb") as handle:
        assert "fox" in client.audio.transcriptions.create(model=MODEL, file=handle).text.lower()
    silence = silent_file(LIMIT_S - 5, "webm", declare_duration=False)  # decoded to its end, under the limit
    response = httpx.post(f"{server.url}/v1/audio/transcriptions", timeout=120,
                          files={"file": ("short.webm", silence)}, data={"model": MODEL, "response_format": "json"})
    assert response.status_code == 200, response.text


def test_the_openai_client_sees_a_413(server, declared_opus):
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=60)
    with pytest.raises(openai.APIStatusError) as caught:
        client.audio.transcriptions.create(model=MODEL, file=("silence.ogg", declared_opus))
    assert caught.value.status_code == 413 and "--max-audio-seconds" in caught.value.message


def test_default_limit_refuses_a_file_just_over_three_hours(model_dir):
    over = silent_wav(3 * 3600 + 60)  # 10.9 MB: within the default upload limit
    with running_server(build_engine(model_dir, max_num_seqs=8), MODEL) as default_server:
        assert default_server.models.settings.max_audio_seconds == 3 * 3600
        response, seconds, growth = _post(default_server, over, "long.wav")
    _assert_refused(response, seconds, growth, 3 * 3600)


def test_transcribe_takes_the_same_bound(model_dir, undeclared_webm):
    from server_utils import SMALL_POOLS

    from seq2seq_engine import LLM
    [result] = LLM(model_dir, **SMALL_POOLS).transcribe(undeclared_webm, max_audio_seconds=LIMIT_S, use_tqdm=False)
    assert result.error is not None and f"longer than max_audio_seconds ({LIMIT_S} s)" in result.error
