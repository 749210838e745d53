"""The server's audio endpoints on Whisper tiny.en, driven by the official `openai` client: all five response
formats give what `llm.transcribe` gives for the same file and options; bad uploads get 4xx; a transcription runs
on the same engine loop as other work and frees its blocks."""
import concurrent.futures
import glob
import json
import os
import re

import httpx
import pytest
from conftest import require_model, require_speech_clips
from server_utils import SMALL_POOLS, build_engine, running_server, wait_until_idle

from seq2seq_engine import LLM
from seq2seq_engine.transcription import render

openai = pytest.importorskip("openai")
pytestmark = pytest.mark.usefixtures("one_thread")

MODEL = "whisper-tiny.en"


@pytest.fixture(scope="module")
def model_dir():
    return require_model(MODEL)


@pytest.fixture(scope="module")
def clip():
    folder = require_speech_clips()
    return sorted(glob.glob(os.path.join(folder, "en", "quick_brown_fox.wav")))[0]


@pytest.fixture(scope="module")
def server(model_dir, one_thread):
    with running_server(build_engine(model_dir, max_num_seqs=8), MODEL) as running:
        yield running


@pytest.fixture(scope="module")
def reference(model_dir):
    return LLM(model_dir, max_num_seqs=8, **SMALL_POOLS)


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=300)


def _transcribe(client, clip, **kwargs):
    with open(clip, "rb") as handle:
        return client.audio.transcriptions.create(model=MODEL, file=handle, **kwargs)


def test_json_and_text_equal_llm_transcribe(client, reference, clip):
    [expected] = reference.transcribe(clip, use_tqdm=False)
    assert expected.error is None and "fox" in expected.text.lower()
    response = _transcribe(client, clip)
    assert response.text == expected.text
    assert response.usage.seconds == int(-(-expected.duration // 1))
    assert _transcribe(client, clip, response_format="text") == render(expected, "txt")


def test_srt_vtt_and_verbose_json_equal_llm_transcribe(client, reference, clip):
    [expected] = reference.transcribe(clip, timestamps=True, use_tqdm=False)
    assert expected.segments
    assert _transcribe(client, clip, response_format="srt") == render(expected, "srt")
    assert _transcribe(client, clip, response_format="vtt") == render(expected, "vtt")
    verbose = _transcribe(client, clip, response_format="verbose_json")
    assert verbose.text == expected.text and verbose.language == "english"
    assert verbose.duration == pytest.approx(expected.duration)
    assert [(s.start, s.end, s.text) for s in verbose.segments] == [
        (s.start, s.end, s.text) for s in expected.segments]
    for got, want in zip(verbose.segments, expected.segments):
        assert (got.avg_logprob, got.compression_ratio, got.no_speech_prob, got.temperature) == pytest.approx(
            (want.avg_logprob, want.compression_ratio, want.no_speech_prob, want.temperature))


def test_word_timestamps_and_engine_extras(client, reference, clip):
    [expected] = reference.transcribe(clip, timestamps=True, word_timestamps=True, temperature=0.0, beam_width=2,
                                      use_tqdm=False)
    verbose = _transcribe(client, clip, response_format="verbose_json", temperature=0.0,
                          timestamp_granularities=["word", "segment"], extra_body={"beam_size": "2"})
    words = [w for segment in expected.segments for w in segment.words]
    assert [w.word for w in verbose.words] == [w.word.strip() for w in words]
    assert [t for w in verbose.words for t in (w.start, w.end)] == pytest.approx(
        [t for w in words for t in (w.start, w.end)])
    assert verbose.text == expected.text


def test_subtitle_fields_give_the_cues_of_render_and_the_cli(client, model_dir, reference, clip, capsys):
    from seq2seq_engine.entrypoints import transcribe_cli
    from seq2seq_engine.transcription.output.subtitles import SubtitleOptions
    [expected] = reference.transcribe(clip, timestamps=True, word_timestamps=True, use_tqdm=False)
    options = SubtitleOptions(max_line_width=16, max_line_count=1, highlight_words=True)
    served = _transcribe(client, clip, response_format="srt",
                         extra_body={"max_line_width": "16", "max_line_count": "1", "highlight_words": "true"})
    assert served == render(expected, "srt", options)
    assert served.count("<u>") == sum(len(segment.words) for segment in expected.segments)
    assert transcribe_cli.main([clip, "--model", model_dir, "--quiet", "--kv-cache-space-gb", "0.3", "--timestamps",
                                "--output-format", "srt", "--max-line-width", "16", "--max-line-count", "1",
                                "--highlight-words"]) == 0
    assert capsys.readouterr().out == served
    [timed] = reference.transcribe(clip, timestamps=True, use_tqdm=False)  # no word timings: times interpolated
    vtt = _transcribe(client, clip, response_format="vtt", extra_body={"max_words_per_line": "2"})
    assert vtt == render(timed, "vtt", 2) and vtt.count("-->") > len(timed.segments)


def test_temperature_fallback_retries_run_on_the_loop(client, reference, clip):
    """A log-prob threshold no window meets: each window is retried at every temperature (the retries are queued
    while a step's outputs are handled, and admitted at the next fill)."""
    options = dict(temperature=(0.0, 0.4, 0.8), log_prob_threshold=0.0, no_speech_threshold=None, seed=3)
    [expected] = reference.transcribe(clip, timestamps=True, use_tqdm=False, **options)
    assert [s.temperature for s in expected.segments] == [0.8] * len(expected.segments)
    verbose = _transcribe(client, clip, response_format="verbose_json", temperature="0,0.4,0.8",
                          extra_body={"log_prob_threshold": "0", "no_speech_threshold": "none", "seed": "3"})
    assert verbose.text == expected.text
    assert [s.temperature for s in verbose.segments] == [0.8] * len(expected.segments)


def test_bad_uploads_get_4xx(server, clip):
    url = f"{server.url}/v1/audio/transcriptions"
    cases = [
        (dict(files={"file": ("notes.wav", b"this is not audio at all" * 50)}, data={"model": MODEL}), 400, "file"),
        (dict(data={"model": MODEL}), 400, "file"),
        (dict(files={"file": ("a.wav", open(clip, "rb").read())}, data={"model": "whisper-1"}), 404, "model"),
        (dict(files={"file": ("a.wav", open(clip, "rb").read())},
              data={"model": MODEL, "response_format": "xml"}), 400, "response_format"),
        (dict(files={"file": ("a.wav", open(clip, "rb").read())}, data={"model": MODEL, "beam_size": "zero"}),
         400, "beam_width"),
        (dict(files={"file": ("a.wav", open(clip, "rb").read())}, data={"model": MODEL, "colour": "blue"}),
         400, "colour"),
        (dict(files={"file": ("a.wav", open(clip, "rb").read())}, data={"model": MODEL, "temperature": "-1"}),
         400, "temperature"),
    ]
    for kwargs, status, param in cases:
        response = httpx.post(url, timeout=120, **kwargs)
        assert response.status_code == status, (kwargs.get("data"), response.text)
        error = response.json()["error"]
        assert error["param"] == param and error["message"], error
    translation = httpx.post(f"{server.url}/v1/audio/translations", timeout=120,
                             files={"file": ("a.wav", open(clip, "rb").read())}, data={"model": MODEL})
    assert translation.status_code == 400 and "translate" in translation.json()["error"]["message"]
    state = wait_until_idle(server)
    assert state["unfinished"] == 0 and state["free"] == state["total"] and state["cross_tables"] == 0


@pytest.mark.parametrize("field, value, param", [
    ("seed", str(2 ** 70), "seed"), ("best_of", str(2 ** 70), "best_of"), ("beam_size", str(2 ** 70), "beam_width"),
    ("max_new_tokens", str(2 ** 64), "max_new_tokens"), ("max_words_per_line", "-3", "max_words_per_line"),
    ("max_words_per_line", str(2 ** 70), "max_words_per_line"), ("no_speech_threshold", "nan", "no_speech_threshold"),
    ("max_line_width", "0", "max_line_width"), ("max_line_count", "-1", "max_line_count"),
    ("max_line_count", "two", "max_line_count"), ("highlight_words", "maybe", "highlight_words"),
])
def test_out_of_range_form_numbers_name_their_field(server, clip, field, value, param):
    response = httpx.post(f"{server.url}/v1/audio/transcriptions", timeout=120,
                          files={"file": ("a.wav", open(clip, "rb").read())},
                          data={"model": MODEL, "response_format": "srt", "temperature": "0.5", field: value})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


def test_client_leaving_a_transcription_aborts_its_job(server, clip, tmp_path):
    import numpy as np
    import soundfile

    from seq2seq_engine.audio import load_audio
    samples = load_audio(clip)
    # about five minutes of dense speech (VAD keeps it all): ten windows still decoding when the client leaves,
    # however fast the machine
    long_file = tmp_path / "long.wav"
    soundfile.write(long_file, np.tile(samples, -(-16000 * 300 // len(samples))), 16000)
    audio_seconds = _metric(server, "audio_seconds_total")
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{server.url}/v1/audio/transcriptions", timeout=1.0, files={"file": open(long_file, "rb")},
                   data={"model": MODEL, "temperature": "0"})
    state = wait_until_idle(server, timeout=60)
    assert state["unfinished"] == 0 and state["free"] == state["total"] and state["cross_tables"] == 0
    assert _metric(server, "audio_seconds_total") == audio_seconds  # aborted: the input never finished


def _metric(server, name):
    text = httpx.get(f"{server.url}/metrics").text
    return float(re.search(rf"^seq2seq_engine:{name}\{{[^}}]*\}} (\S+)$", text, re.M).group(1))


def test_concurrent_transcriptions_share_the_loop_and_free_blocks(server, reference, clip):
    [expected] = reference.transcribe(clip, temperature=0.0, use_tqdm=False)

    def post(_):
        with open(clip, "rb") as handle:
            response = httpx.post(f"{server.url}/v1/audio/transcriptions", timeout=300, files={"file": handle},
                                  data={"model": MODEL, "temperature": "0", "response_format": "json"})
        return json.loads(response.text)["text"]

    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        assert list(pool.map(post, range(3))) == [expected.text] * 3
    metrics = httpx.get(f"{server.url}/metrics").text
    assert "seq2seq_engine:audio_seconds_total" in metrics
    state = wait_until_idle(server)
    assert state["free"] == state["total"] and state["cross_tables"] == 0


def test_streamed_transcription_sends_each_window_as_it_is_final(client, reference, server, clip, tmp_path):
    import soundfile

    from seq2seq_engine.audio import load_audio
    speech = load_audio(clip)
    padded = list(speech) + [0.0] * (30 * 16000 - len(speech))
    two_windows = tmp_path / "two_windows.wav"
    # the second window says it twice: its request runs longer, so the first window is final earlier
    soundfile.write(two_windows, padded + list(speech) * 2, 16000, subtype="FLOAT")
    [expected] = reference.transcribe(str(two_windows), vad_filter=False, timestamps=True, use_tqdm=False)
    with open(two_windows, "rb") as handle:
        events = list(client.audio.transcriptions.create(model=MODEL, file=handle, stream=True,
                                                         response_format="verbose_json",  # timed segments
                                                         extra_body={"vad_filter": "false"}))
    deltas, done = events[:-1], events[-1]
    assert [event.type for event in deltas] == ["transcript.text.delta"] * 2
    assert all(s["end"] <= 30 for s in deltas[0].model_extra["segments"])  # the first window only
    assert done.type == "transcript.text.done" and done.text == expected.text
    assert "".join(event.delta for event in deltas).strip() == expected.text
    segments = [segment for event in deltas for segment in event.model_extra["segments"]]
    assert [(s["id"], s["start"], s["end"], s["text"]) for s in segments] == [
        (k, s.start, s.end, s.text) for k, s in enumerate(expected.segments)]
    url = f"{server.url}/v1/audio/transcriptions"
    not_audio = httpx.post(url, timeout=120, files={"file": ("notes.wav", b"not audio at all" * 50)},
                           data={"model": MODEL, "stream": "true"})
    assert not_audio.status_code == 400 and not_audio.json()["error"]["param"] == "file"
    srt = httpx.post(url, timeout=120, files={"file": ("a.wav", open(clip, "rb").read())},
                     data={"model": MODEL, "stream": "true", "response_format": "srt"})
    assert srt.status_code == 400 and srt.json()["error"]["param"] == "stream"
    state = wait_until_idle(server)
    assert state["unfinished"] == 0 and state["free"] == state["total"] and not state["cross_tables"]
