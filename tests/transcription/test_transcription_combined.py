"""VAD, streamed formats, folders and the robustness rules together, end to end with the real whisper-tiny.en
(whisper-base for language detection) and Silero VAD: an mp3 of two clips apart, transcribed with VAD inside
clip_timestamps while every attempt falls back; a clipped stream in sequential mode with beam search equals the same
call on the decoded array; language detection on a VAD window; the CLI on a folder with every kind of flag."""
import json
import os

import numpy as np
import pytest
from av_media import encode, speech_clip
from conftest import require_model

from seq2seq_engine.audio import load_audio
from seq2seq_engine.entrypoints import transcribe_cli
from seq2seq_engine.transcription.schedule import result_assembler

pytestmark = pytest.mark.usefixtures("one_thread", "no_leaked_blocks")
pytest.importorskip("av")
SR = 16000
TOLERANCE = 0.5  # s: speech_pad_ms (0.4 s) plus a Whisper timestamp step or two


@pytest.fixture(scope="module")
def two_clips_mp3(tmp_path_factory):
    """An mp3 of 2 s silence, "Hello world.", 20 s of silence and noise, "The quick brown fox ...", 1 s silence;
    with the clips' (start, end) seconds."""
    (_, hello, _), (_, fox, _) = speech_clip("hello_world"), speech_clip("quick_brown_fox")
    noise = 0.01 * np.random.default_rng(0).standard_normal(10 * SR)
    parts = [np.zeros(2 * SR), hello, np.zeros(10 * SR), noise, fox, np.zeros(SR)]
    starts = np.cumsum([0] + [len(p) for p in parts]) / SR
    path = encode(tmp_path_factory.mktemp("mp3") / "two_clips.mp3", np.concatenate(parts), SR, "mp3")
    return path, [(starts[1], starts[2]), (starts[4], starts[5])]


@pytest.fixture()
def requests(tiny_llm, monkeypatch):
    """The params of every request the pipeline adds."""
    engine, added = tiny_llm.llm_engine, []
    real = engine.add_request

    def spy(request_id, prompt, params, *args, **kwargs):
        added.append(params)
        return real(request_id, prompt, params, *args, **kwargs)

    monkeypatch.setattr(engine, "add_request", spy)
    return added


def test_vad_inside_clips_on_an_mp3_with_every_attempt_falling_back(tiny_llm, two_clips_mp3, requests):
    path, (_, (fox_start, fox_end)) = two_clips_mp3
    # the clip holds the second utterance only; a log-prob threshold no decoding meets makes every window fall back
    results = list(tiny_llm.iter_transcribe([path], vad_filter=True, timestamps=True,
                                            clip_timestamps=(fox_start - 3.0,), temperature=(0.0, 0.3), best_of=2,
                                            log_prob_threshold=-1e-6, no_speech_threshold=None, use_tqdm=False))
    assert [index for index, _ in results] == [0]
    result = results[0][1]
    assert result.error is None and result.duration == pytest.approx(len(load_audio(path)) / SR)
    assert "brown fox" in result.text.lower() and "hello" not in result.text.lower()
    assert [params.temperature for params in requests] == [0.0, 0.3]  # one packed window, decoded twice
    assert result.segments and all(segment.temperature == 0.3 for segment in result.segments)
    assert all(fox_start - TOLERANCE <= s.start <= s.end <= fox_end + TOLERANCE for s in result.segments)


def test_a_clipped_stream_in_sequential_beam_mode_equals_the_decoded_array(tiny_llm, tmp_path, monkeypatch):
    _, fox, _ = speech_clip("quick_brown_fox")
    audio = np.zeros(75 * SR, np.float32)
    for start in (1, 31, 61):
        audio[start * SR:start * SR + len(fox)] = fox
    path = encode(tmp_path / "long.mp3", audio, SR, "mp3")
    stitched = []
    real = result_assembler.stitch

    def spy(windows, *args, **kwargs):
        stitched.append([(w.offset, w.duration, list(w.token_ids)) for w in windows])
        return real(windows, *args, **kwargs)

    monkeypatch.setattr(result_assembler, "stitch", spy)
    options = dict(clip_timestamps=(25.0, 70.0), condition_on_previous_text=True, beam_width=2, timestamps=True,
                   initial_prompt="A fox.", use_tqdm=False, vad_filter=False)
    streamed = tiny_llm.transcribe(path, **options)[0]
    whole = tiny_llm.transcribe((load_audio(path), SR), **options)[0]
    assert stitched[0] == stitched[1] and [(o, d) for o, d, _ in stitched[0]] == [(25.0, 30.0), (55.0, 15.0)]
    assert (streamed.text, streamed.segments) == (whole.text, whole.segments)
    assert streamed.text.lower().count("brown fox") == 2 and streamed.duration == whole.duration


def test_language_detection_on_a_vad_window():
    from seq2seq_engine import LLM
    llm = LLM(require_model("whisper-base"), kv_cache_space_gb=0.3, swap_space_gb=0.01)
    _, hola, _ = speech_clip("hola_mundo", language="es")
    audio = np.concatenate([np.zeros(25 * SR), hola, np.zeros(40 * SR)]).astype(np.float32)
    result = llm.transcribe((audio, SR), vad_filter=True, timestamps=True, temperature=0.0, use_tqdm=False)[0]
    assert result.language == "es" and result.language_probability > 0.5 and "mundo" in result.text.lower()
    end = 25 + len(hola) / SR
    assert all(25 - TOLERANCE <= s.start <= s.end <= end + TOLERANCE for s in result.segments)


def test_cli_folder_with_vad_and_decoding_flags(tiny_dir, two_clips_mp3, tmp_path, capsys):
    path, spans = two_clips_mp3
    folder, out = tmp_path / "in", tmp_path / "out"
    (folder / "sub").mkdir(parents=True)
    os.symlink(path, folder / "sub" / "two.mp3")
    _, fox, _ = speech_clip("quick_brown_fox")
    encode(folder / "fox.m4a", fox, SR, "m4a")
    flags = [str(folder), "--recursive", "--model", tiny_dir, "--vad-filter", "--vad-min-silence-ms", "500",
             "--timestamps", "--temperature", "0,0.4", "--initial-prompt", "Fox.", "--output-format", "json",
             "--output-dir", str(out), "--quiet"]
    assert transcribe_cli.main(flags) == transcribe_cli.EXIT_OK
    records = {name: json.loads((out / name).read_text()) for name in ("sub/two.json", "fox.json")}
    assert "brown fox" in records["fox.json"]["text"].lower()
    two = records["sub/two.json"]
    assert "hello" in two["text"].lower() and "brown fox" in two["text"].lower()
    for segment in two["segments"]:
        assert segment["temperature"] in (0.0, 0.4) and segment["no_speech_prob"] is not None
        assert any(start - TOLERANCE <= segment["start"] <= segment["end"] <= end + TOLERANCE for start, end in spans)
    capsys.readouterr()
    assert transcribe_cli.main(flags) == transcribe_cli.EXIT_OK  # resumed: both outputs exist
    assert "skipped 2 input(s)" in capsys.readouterr().err
    # a bad option is a usage error before any file is read or the model loaded
    assert transcribe_cli.main([str(tmp_path / "nothing"), "--temperature", "-1"]) == transcribe_cli.EXIT_USAGE
    assert transcribe_cli.main([str(folder), "--vad-threshold", "0.3", "--no-vad-filter"]) == transcribe_cli.EXIT_USAGE
    assert "cannot be used with --no-vad-filter" in capsys.readouterr().err
