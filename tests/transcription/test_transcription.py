"""Whisper transcription (seq2seq_engine.transcription) with real models (the packaged Whisper tiny.en and base,
skipped when not installed): prompts against HF's `_retrieve_init_tokens` and the tokenizer's `prefix_tokens`; greedy
window tokens of `transcribe` against `WhisperForConditionalGeneration.generate` on espeak-ng speech (with and
without timestamps, windows of long audio, conditioning on the previous window); language detection against HF's
`detect_language`; one unreadable input among good ones; the CLI. Unit tests: test_transcription_units.py.
"""
import copy
import json
import math
import shutil
import subprocess

import numpy as np
import pytest
import torch
import transformers
from conftest import require_model

from seq2seq_engine.transcription import Segment, TranscriptionResult, pipeline as pipeline_module
from seq2seq_engine.transcription.prompts import whisper_tokens_for
from seq2seq_engine.transcription.schedule import result_assembler

pytestmark = pytest.mark.usefixtures("one_thread")


# ---------------------------------------------------------------------------------------------- real models
@pytest.fixture(scope="module")
def tiny_hf(tiny_dir):
    return transformers.WhisperForConditionalGeneration.from_pretrained(tiny_dir).eval()


@pytest.fixture(scope="module")
def speech(tmp_path_factory):
    """espeak-ng speech (22.05 kHz wav files: the engine resamples them) and their 16 kHz samples."""
    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng is not installed")
    from seq2seq_engine.audio import load_audio
    folder = tmp_path_factory.mktemp("speech")
    texts = {"fox": ("en", "The quick brown fox jumps over the lazy dog. Speech recognition is fun."),
             "weather": ("en", "Tomorrow the weather will be sunny with a light breeze from the west."),
             "german": ("de", "Guten Morgen. Heute lernen wir, wie man einen Kuchen backt.")}
    clips = {}
    for name, (voice, text) in texts.items():
        path = folder / f"{name}.wav"
        subprocess.run(["espeak-ng", "-v", voice, "-w", str(path), text], check=True, timeout=60)
        clips[name] = (str(path), load_audio(str(path)))
    return clips


def _features(samples):
    extractor = transformers.WhisperFeatureExtractor(feature_size=80)
    return torch.from_numpy(extractor(samples, sampling_rate=16000, return_tensors="np").input_features)


def _hf_generate(model, samples, prompt, max_new_tokens, **kwargs):
    """HF greedy tokens after the prompt (eos dropped); checks that HF's decoder prompt equals ours."""
    with torch.no_grad():
        out = model.generate(_features(samples), max_new_tokens=max_new_tokens, return_dict_in_generate=True,
                             **kwargs)
    sequence = out.sequences[0].tolist()
    assert sequence[:len(prompt)] == prompt
    tokens = sequence[len(prompt):]
    return tokens[:-1] if tokens and tokens[-1] == model.generation_config.eos_token_id else tokens


@pytest.fixture()
def window_spy(monkeypatch):
    """Records the per-window tokens each transcribed input was stitched from."""
    calls = []
    real = result_assembler.stitch

    def spy(windows, *args, **kwargs):
        calls.append([copy.deepcopy(w) for w in windows])
        return real(windows, *args, **kwargs)

    monkeypatch.setattr(result_assembler, "stitch", spy)
    return calls


def _hf_retrieve_init_tokens(model, language, task, timestamps):
    config = copy.deepcopy(model.generation_config)
    model._set_language_and_task(language=language, task=task, is_multilingual=None, generation_config=config)
    config.return_timestamps = timestamps
    init = model._retrieve_init_tokens(None, 1, config, model.config, 3000, {})
    return init[0].tolist()


def test_english_only_prompts_match_hf(tiny_dir, tiny_hf, tiny_llm):
    tokens = whisper_tokens_for(tiny_llm.llm_engine)
    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_dir)
    assert not tokens.is_multilingual
    for timestamps in (False, True):
        assert tokens.prompt(timestamps=timestamps) == _hf_retrieve_init_tokens(tiny_hf, None, None, timestamps)
    assert tokens.prompt() == tokenizer.prefix_tokens == tokenizer.convert_tokens_to_ids(
        ["<|startoftranscript|>", "<|notimestamps|>"])
    assert tokens.prompt(language="English") == tokens.prompt()
    for bad in (dict(language="de"), dict(task="translate")):
        with pytest.raises(ValueError):
            tokens.prompt(**bad)
        with pytest.raises(ValueError):  # HF refuses these for English-only models too
            _hf_retrieve_init_tokens(tiny_hf, bad.get("language"), bad.get("task"), False)
    # <|startofprev|> + previous text before the prompt, as HF builds decoder_input_ids from prompt_ids
    prompt_ids = tokenizer.get_prompt_ids("Hello there, how are you?").tolist()
    assert tokens.prompt(previous_tokens=prompt_ids[1:]) == prompt_ids + tokens.prompt()
    long_previous = list(range(1000, 1300))
    assert tokens.prompt(previous_tokens=long_previous)[1:224] == long_previous[-223:]
    assert tokens.max_new_tokens(len(tokens.prompt())) == 224
    assert tokens.max_new_tokens(300, 500) == 148


def test_transcribe_matches_hf_generate_and_isolates_bad_inputs(tmp_path, speech, tiny_hf, tiny_llm, tiny_dir,
                                                                window_spy):
    fox_path, fox = speech["fox"]
    weather_path, weather = speech["weather"]
    corrupt = tmp_path / "corrupt.wav"
    corrupt.write_bytes(b"RIFF\x10\x00\x00\x00WAVEfmt garbage that is no audio" * 3)
    nan_audio = np.full(16000, np.nan, dtype=np.float32)
    silence = np.zeros(16000 * 5, dtype=np.float32)
    inputs = [fox_path, str(corrupt), (weather, 16000), str(tmp_path / "missing.wav"), nan_audio, silence]
    # max_in_flight=2: inputs are loaded and admitted a few at a time, results still come back in input order
    kwargs = dict(max_new_tokens=64, use_tqdm=False, max_in_flight=2, temperature=0.0, beam_width=1)
    if hasattr(tiny_llm, "transcribe"):
        results = tiny_llm.transcribe(inputs, **kwargs)
    else:
        results = pipeline_module.transcribe(tiny_llm, inputs, **kwargs)

    assert [r.error is None for r in results] == [True, False, True, False, False, True]
    assert "corrupt" in results[1].error and "not found" in results[3].error and "NaN" in results[4].error
    assert all(r.text == "" and r.segments == [] for r in results if r.error)
    assert (results[5].text, results[5].segments, results[5].duration) == ("", [], 5.0)  # silence: not decoded
    assert not tiny_llm.llm_engine.has_unfinished_requests()
    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_dir)
    prompt = whisper_tokens_for(tiny_llm.llm_engine).prompt()
    for result, samples, windows in zip([results[0], results[2]], [fox, weather], window_spy):
        expected = _hf_generate(tiny_hf, samples, prompt, 64)
        assert len(expected) > 5
        assert [w.token_ids for w in windows] == [expected]
        assert result.text == tokenizer.decode(expected, skip_special_tokens=True).strip()
        assert result.language == "en" and result.duration == pytest.approx(len(samples) / 16000)
        assert result.segments == [Segment(0.0, len(samples) / 16000, result.text)]


def test_timestamps_and_long_audio_windows_match_hf(speech, tiny_hf, tiny_llm, tiny_dir, window_spy):
    _, fox = speech["fox"]
    _, weather = speech["weather"]
    long_audio = np.concatenate([fox, np.zeros(16000 * 30 - len(fox), np.float32), weather])
    results = pipeline_module.transcribe(tiny_llm, [(fox, 16000), long_audio], timestamps=True,
                                         max_new_tokens=64, use_tqdm=False, temperature=0.0, beam_width=1,
                                         vad_filter=False)
    prompt = whisper_tokens_for(tiny_llm.llm_engine).prompt(timestamps=True)
    expected = [_hf_generate(tiny_hf, samples, prompt, 64, return_timestamps=True, force_unique_generate_call=True)
                for samples in (fox, weather)]
    assert [w.token_ids for w in window_spy[0]] == [expected[0]]
    assert [w.token_ids for w in window_spy[1]] == expected  # both 30 s windows of the long input
    assert [w.offset for w in window_spy[1]] == [0.0, 30.0]

    # Segments: HF's own timestamp decoding of each window, shifted by the window's offset.
    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_dir)
    hf_segments = []
    for offset, tokens in zip((0.0, 30.0), expected):
        for piece in tokenizer.decode(tokens, output_offsets=True)["offsets"]:
            start, end = piece["timestamp"]
            hf_segments.append((offset + start, offset + end, piece["text"].strip()))
    got = [(s.start, s.end, s.text) for s in results[1].segments]
    assert len(got) == len(hf_segments) >= 2
    for (start, end, text), (hf_start, hf_end, hf_text) in zip(got, hf_segments):
        assert (start, end, text) == (pytest.approx(hf_start), pytest.approx(hf_end), hf_text)
    assert results[0].segments == [s for s in results[1].segments if s.start < 30.0]
    assert results[1].text == " ".join(s.text for s in results[1].segments)


def test_condition_on_previous_text_matches_hf_prompt_ids(speech, tiny_hf, tiny_llm, window_spy):
    _, fox = speech["fox"]
    _, weather = speech["weather"]
    long_audio = np.concatenate([fox, np.zeros(16000 * 30 - len(fox), np.float32), weather])
    results = pipeline_module.transcribe(tiny_llm, [long_audio], condition_on_previous_text=True,
                                         max_new_tokens=48, use_tqdm=False, temperature=0.0, beam_width=1,
                                         vad_filter=False)
    tokens = whisper_tokens_for(tiny_llm.llm_engine)
    first, second = window_spy[0]
    assert first.token_ids == _hf_generate(tiny_hf, fox, tokens.prompt(), 48)
    prompt_ids = [tokens.start_of_prev] + first.token_ids
    expected = _hf_generate(tiny_hf, weather, prompt_ids + tokens.prompt(), 48, prompt_ids=torch.tensor(prompt_ids))
    assert second.token_ids == expected
    assert results[0].error is None and len(results[0].segments) == 2


@pytest.fixture(scope="module")
def base_dir():
    return require_model("whisper-base")


def test_multilingual_prompts_and_language_detection_match_hf(base_dir, speech, window_spy):
    from seq2seq_engine import LLM
    hf = transformers.WhisperForConditionalGeneration.from_pretrained(base_dir).eval()
    llm = LLM(base_dir, kv_cache_space_gb=0.4, swap_space_gb=0.01)  # room for all four requests at once
    tokens = whisper_tokens_for(llm.llm_engine)
    tokenizer = transformers.AutoTokenizer.from_pretrained(base_dir)
    assert tokens.is_multilingual and len(tokens.language_ids) == 99
    for language, task, timestamps in [("en", "transcribe", False), ("german", "translate", False),
                                       ("<|fr|>", "transcribe", True), ("ja", "translate", True)]:
        ours = tokens.prompt(language, task, timestamps)
        assert ours == _hf_retrieve_init_tokens(hf, language, task, timestamps)
        tokenizer.set_prefix_tokens(language=tokens.language_code(language), task=task,
                                    predict_timestamps=timestamps)
        assert ours == tokenizer.prefix_tokens
    with pytest.raises(ValueError, match="unsupported language"):
        tokens.prompt("klingon")

    clips = [speech["german"][1], speech["fox"][1]]
    results = pipeline_module.transcribe(llm, [(c, 16000) for c in clips], max_new_tokens=24, use_tqdm=False,
                                         temperature=0.0, beam_width=1)
    with torch.no_grad():
        encoder_outputs = hf.model.encoder(torch.cat([_features(c) for c in clips]))
        detected = hf.detect_language(encoder_outputs=encoder_outputs).tolist()
        logits = hf(encoder_outputs=encoder_outputs, decoder_input_ids=torch.full((2, 1), tokens.sot)).logits[:, -1]
    language_ids = sorted(tokens.language_ids.values())
    by_id = {v: k for k, v in tokens.language_ids.items()}
    for result, hf_id, row, samples, windows in zip(results, detected, logits, clips, window_spy):
        assert result.language == by_id[hf_id]
        probability = torch.softmax(row[language_ids], dim=-1).max().item()
        assert result.language_probability == pytest.approx(probability, abs=1e-4)
        expected = _hf_generate(hf, samples, tokens.prompt(result.language), 24, language=result.language,
                                task="transcribe")
        assert [w.token_ids for w in windows] == [expected]
    assert results[0].language == "de" and results[1].language == "en"


def test_cli_writes_one_file_per_input_and_fails_on_bad_ones(tmp_path, speech, tiny_dir, capsys):
    from seq2seq_engine.entrypoints import transcribe_cli
    fox_path, fox = speech["fox"]
    bad = tmp_path / "bad.wav"
    bad.write_bytes(b"not audio at all")
    out_dir = tmp_path / "out"
    code = transcribe_cli.main([fox_path, str(bad), "--model", tiny_dir, "--output-format", "json", "--output-dir",
                                str(out_dir), "--timestamps", "--max-new-tokens", "48", "--quiet", "--beam-width", "1",
                                "--kv-cache-space-gb", "0.2"])
    assert code == 1
    assert "bad.wav" in capsys.readouterr().err
    good = json.loads((out_dir / "fox.json").read_text(encoding="utf-8"))
    failed = json.loads((out_dir / "bad.json").read_text(encoding="utf-8"))
    assert good["error"] is None and "lazy dog" in good["text"] and len(good["segments"]) >= 2
    assert good["segments"][0]["temperature"] == 0.0 and good["segments"][0]["no_speech_prob"] < 0.6  # scores
    assert math.isclose(good["duration"], len(fox) / 16000, abs_tol=1e-3)
    assert failed["error"] and failed["text"] == "" and failed["segments"] == []


def test_cli_output_to_stdout_and_usage_errors(tmp_path):
    import argparse
    import io

    from seq2seq_engine.entrypoints import transcribe_cli
    results = [TranscriptionResult("Hello there.", "en", [Segment(0.0, 1.5, "Hello there.")], None, 2.0),
               TranscriptionResult("", None, [], "x.wav: file not found", 0.0),
               TranscriptionResult("Bye.", "en", [Segment(30.0, 31.0, "Bye.")], None, 31.0)]
    out, err = io.StringIO(), io.StringIO()
    assert transcribe_cli.write_results(results, ["a.wav", "x.wav", "b.wav"], "txt", None, out, err) == 1
    assert out.getvalue() == "Hello there.\n\nBye.\n" and "x.wav: file not found" in err.getvalue()
    out = io.StringIO()
    assert transcribe_cli.write_results(results[:1], ["a.wav"], "vtt", None, out, io.StringIO()) == 0
    assert out.getvalue() == "WEBVTT\n\n00:00:00.000 --> 00:00:01.500\nHello there.\n"
    # one file per input; clashing names get a suffix; failed inputs write no subtitles
    transcribe_cli.write_results(results, ["d1/a.wav", "x.wav", "d2/a.wav"], "srt", str(tmp_path), io.StringIO(),
                                 io.StringIO())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-2.srt", "a.srt"]
    assert (tmp_path / "a-2.srt").read_text() == "1\n00:00:30,000 --> 00:00:31,000\nBye.\n"
    parser = argparse.ArgumentParser(prog="seq2seq-engine")
    transcribe_cli.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["transcribe", "a.wav", "b.wav", "--output-format", "srt"])
    assert args.command == "transcribe" and args.model == "whisper-tiny.en"
    err = io.StringIO()
    assert transcribe_cli.run(args, io.StringIO(), err) == 2 and "--output-dir" in err.getvalue()


def test_cli_beam_width_gives_hf_beam_search_text(tmp_path, speech, tiny_dir, tiny_hf, capsys):
    from seq2seq_engine.entrypoints import transcribe_cli
    fox_path, fox = speech["fox"]
    code = transcribe_cli.main([fox_path, "--model", tiny_dir, "--beam-width", "3", "--temperature", "0",
                                "--max-new-tokens", "40", "--quiet", "--kv-cache-space-gb", "0.2"])
    assert code == 0
    with torch.no_grad():
        sequences = tiny_hf.generate(_features(fox), num_beams=3, max_new_tokens=40)
    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_dir)
    expected = tokenizer.decode(sequences[0], skip_special_tokens=True).strip()
    assert capsys.readouterr().out.strip() == expected
