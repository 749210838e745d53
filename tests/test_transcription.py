"""Whisper transcription (seq2seq_engine.transcription).

Unit level, no model: the logits processors against transformers' own processors on random logits and token
histories (identical outputs), segment splitting and window stitching on hand-built token sequences, srt/vtt.
Real models (the packaged Whisper tiny.en and base, skipped when not installed): prompts against HF's
`_retrieve_init_tokens` and the tokenizer's `prefix_tokens`; greedy window tokens of `transcribe` against
`WhisperForConditionalGeneration.generate` on espeak-ng speech (with and without timestamps, windows of long
audio, conditioning on the previous window); language detection against HF's `detect_language`; one unreadable
input among good ones; the CLI.
"""
import copy
import json
import math
import random
import shutil
import subprocess

import numpy as np
import pytest
import torch
import transformers
from transformers.generation.logits_process import (SuppressTokensAtBeginLogitsProcessor,
                                                    SuppressTokensLogitsProcessor, WhisperTimeStampLogitsProcessor)

from seq2seq_engine.transcription import (Segment, SuppressTokens, SuppressTokensAtBegin, TranscriptionResult,
                                          WhisperTimestamps, WhisperTokens, WindowTokens, format_timestamp,
                                          split_segments, stitch, to_srt, to_vtt, whisper_processors)
from seq2seq_engine.transcription import pipeline as pipeline_module
from seq2seq_engine.transcription.processors import OnlyTokens

# The English-only vocabulary layout (tiny.en), for tests that need ids but no model.
EN = WhisperTokens(sot=50257, eot=50256, no_timestamps=50362, vocab_size=51864, max_target_positions=448,
                   is_multilingual=False, language_ids={"en": 50258, "zh": 50259, "de": 50260},
                   transcribe=50358, translate=50357, start_of_prev=50360, suppress_tokens=(1, 2, 7, 50357, 50361),
                   begin_suppress_tokens=(220, 50256), max_initial_timestamp_index=50)
TB = EN.timestamp_begin  # <|0.00|>


def ts(seconds: float) -> int:
    return TB + int(round(seconds / 0.02))


# ---------------------------------------------------------------------------------------------- processors
def _random_history(rng: random.Random, length: int):
    """Arbitrary mixes of text tokens, timestamps (often repeated/decreasing) and eos: the processors must agree
    with HF on any history, not only well-formed ones."""
    out = []
    for _ in range(length):
        kind = rng.random()
        if kind < 0.45:
            out.append(rng.randrange(0, EN.eot))
        elif kind < 0.9:
            out.append(TB + rng.choice([0, 1, 2, 49, 50, 51, 200, 1500, rng.randrange(0, 1501)]))
        else:
            out.append(rng.choice([EN.eot, EN.no_timestamps, EN.sot]))
    return out


def _random_logits(rng: random.Random, gen: torch.Generator):
    logits = torch.randn(EN.vocab_size, generator=gen) * rng.choice([0.5, 2.0, 8.0])
    if rng.random() < 0.5:  # make the timestamps' total probability beat the best text token now and then
        logits[TB:] += rng.choice([2.0, 4.0, 6.0])
    if rng.random() < 0.3:
        logits[rng.randrange(0, TB)] += 25.0
    return logits


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """These tests run single-threaded (ours and HF alike): on a shared 2-core machine two intra-op threads wait on
    each other whenever another process holds a core; this file measured 150 s with 2 threads, 30 s with 1."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _hf(processor, prompt, history, logits):
    return processor(torch.tensor([prompt + history]), logits.clone()[None])[0]


def test_processors_equal_hf_processors_on_random_logits_and_histories():
    rng, gen = random.Random(0), torch.Generator().manual_seed(0)
    hf_config = transformers.GenerationConfig(no_timestamps_token_id=EN.no_timestamps, eos_token_id=EN.eot,
                                              max_initial_timestamp_index=EN.max_initial_timestamp_index)
    forced = 0
    for case in range(400):
        prompt = [EN.sot] + [rng.randrange(0, EN.vocab_size) for _ in range(rng.choice([0, 1, 3]))]
        history = _random_history(rng, rng.choice([0, 0, 1, 1, 2, 2, 3, 5, 8]))
        logits = _random_logits(rng, gen)
        begin = len(prompt)
        pairs = [
            (SuppressTokens(EN.suppress_tokens), SuppressTokensLogitsProcessor(EN.suppress_tokens)),
            (SuppressTokensAtBegin(EN.begin_suppress_tokens),
             SuppressTokensAtBeginLogitsProcessor(EN.begin_suppress_tokens, begin_index=begin)),
            (WhisperTimestamps(EN.no_timestamps, EN.eot, EN.max_initial_timestamp_index),
             WhisperTimeStampLogitsProcessor(hf_config, begin_index=begin)),
        ]
        for ours, theirs in pairs:
            expected = _hf(theirs, prompt, history, logits)
            got = ours(list(history), logits.clone())
            assert torch.equal(got, expected), (case, type(ours).__name__, prompt, history)
        if torch.isinf(_hf(pairs[2][1], prompt, history, logits)[:TB]).all():
            forced += 1
    assert 40 < forced < 360  # both branches of the "force a timestamp" rule were exercised


def test_processor_chain_equals_hf_chain_in_generate_order():
    """begin-suppress, suppress, timestamps in that order (HF `_retrieve_logit_processors`)."""
    rng, gen = random.Random(1), torch.Generator().manual_seed(1)
    hf_config = transformers.GenerationConfig(no_timestamps_token_id=EN.no_timestamps, eos_token_id=EN.eot,
                                              max_initial_timestamp_index=EN.max_initial_timestamp_index)
    for case in range(100):
        prompt = [EN.sot]
        history = _random_history(rng, rng.choice([0, 1, 2, 4]))
        logits = _random_logits(rng, gen)
        theirs = [SuppressTokensAtBeginLogitsProcessor(EN.begin_suppress_tokens, begin_index=1),
                  SuppressTokensLogitsProcessor(EN.suppress_tokens),
                  WhisperTimeStampLogitsProcessor(hf_config, begin_index=1)]
        expected = logits.clone()[None]
        for processor in theirs:
            expected = processor(torch.tensor([prompt + history]), expected)
        got = logits.clone()
        for processor in whisper_processors(EN, timestamps=True):
            got = processor(history, got)
        assert torch.equal(got, expected[0]), (case, history)
    assert len(whisper_processors(EN, timestamps=False)) == 2


def test_only_tokens_keeps_exactly_the_language_tokens():
    logits = torch.randn(EN.vocab_size, generator=torch.Generator().manual_seed(2))
    out = OnlyTokens(EN.language_ids.values())([], logits.clone())
    kept = torch.isfinite(out).nonzero().flatten().tolist()
    assert kept == sorted(EN.language_ids.values())
    assert torch.equal(out[kept], logits[kept])


# ---------------------------------------------------------------------------------------------- segments
def _decode(ids):
    return "".join(f" w{i}" for i in ids)


def test_split_segments_pairs_single_ending_and_open_end():
    tokens = [ts(0), 11, 12, ts(1.2), ts(1.4), 13, ts(2.0)]
    assert split_segments(tokens, EN, 30.0) == [(0.0, 1.2, [11, 12]), (1.4, 2.0, [13])]
    # double timestamp at the end, then text cut by the window end (no closing timestamp)
    tokens = [ts(0.5), 11, ts(3.0), ts(3.0), 12, 13]
    assert split_segments(tokens, EN, 10.0) == [(0.5, 3.0, [11]), (3.0, 10.0, [12, 13])]
    # no timestamps at all: one segment over the window; special tokens are ignored
    assert split_segments([EN.sot, 11, 12], EN, 7.5) == [(0.0, 7.5, [11, 12])]
    # empty openings are replaced by later ones; timestamps past the window are clamped to it
    assert split_segments([ts(0), ts(0.4), 11, ts(29.0)], EN, 5.0) == [(0.4, 5.0, [11])]
    assert split_segments([], EN, 30.0) == []


def test_stitch_shifts_window_segments_by_their_offsets():
    windows = [WindowTokens(0.0, 30.0, [ts(0), 11, ts(2.5), ts(2.5), 12, 13, ts(29.9)]),
               WindowTokens(30.0, 30.0, [ts(0.2), 14, ts(4.0)]),
               WindowTokens(60.0, 12.25, [ts(1.0), 15, 16])]
    text, segments = stitch(windows, EN, _decode, timestamps=True)
    assert segments == [Segment(0.0, 2.5, "w11"), Segment(2.5, 29.9, "w12 w13"), Segment(30.2, 34.0, "w14"),
                        Segment(61.0, 72.25, "w15 w16")]
    assert text == "w11 w12 w13 w14 w15 w16"


def test_stitch_without_timestamps_gives_one_segment_per_window_with_text():
    windows = [WindowTokens(0.0, 30.0, [11, 12]), WindowTokens(30.0, 30.0, []), WindowTokens(60.0, 3.5, [13])]
    text, segments = stitch(windows, EN, _decode, timestamps=False)
    assert text == "w11 w12 w13"
    assert segments == [Segment(0.0, 30.0, "w11 w12"), Segment(60.0, 63.5, "w13")]


# ---------------------------------------------------------------------------------------------- formats
def test_srt_and_vtt_formatting():
    result = TranscriptionResult("Hello there. General Kenobi!", "en",
                                 [Segment(0.0, 2.5, "Hello there."), Segment(3661.0015, 3663.9996, "General Kenobi!"),
                                  Segment(4000.0, 4001.0, "  ")], None, 4001.0)
    assert to_srt(result) == ("1\n00:00:00,000 --> 00:00:02,500\nHello there.\n\n"
                              "2\n01:01:01,002 --> 01:01:04,000\nGeneral Kenobi!\n")
    assert to_vtt(result) == ("WEBVTT\n\n00:00:00.000 --> 00:00:02.500\nHello there.\n\n"
                              "01:01:01.002 --> 01:01:04.000\nGeneral Kenobi!\n")
    assert format_timestamp(59.9999) == "00:01:00.000"
    assert format_timestamp(5.25, ",", always_include_hours=False) == "00:05,250"
    with pytest.raises(ValueError):
        format_timestamp(-1.0)


# ---------------------------------------------------------------------------------------------- real models
def _resolve(name):
    from seq2seq_engine.model_resolver import resolve_model_path
    try:
        return resolve_model_path(name)
    except ValueError as error:  # the model's pip package is not installed
        pytest.skip(str(error))


@pytest.fixture(scope="module")
def tiny_dir():
    return _resolve("whisper-tiny.en")


@pytest.fixture(scope="module")
def tiny_hf(tiny_dir):
    return transformers.WhisperForConditionalGeneration.from_pretrained(tiny_dir).eval()


@pytest.fixture(scope="module")
def tiny_llm(tiny_dir):
    from seq2seq_engine import LLM
    return LLM(tiny_dir, kv_cache_space_gb=0.3, swap_space_gb=0.01)


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
    real = pipeline_module.stitch

    def spy(windows, *args, **kwargs):
        calls.append([copy.deepcopy(w) for w in windows])
        return real(windows, *args, **kwargs)

    monkeypatch.setattr(pipeline_module, "stitch", spy)
    return calls


def _hf_retrieve_init_tokens(model, language, task, timestamps):
    config = copy.deepcopy(model.generation_config)
    model._set_language_and_task(language=language, task=task, is_multilingual=None, generation_config=config)
    config.return_timestamps = timestamps
    init = model._retrieve_init_tokens(None, 1, config, model.config, 3000, {})
    return init[0].tolist()


def test_english_only_prompts_match_hf(tiny_dir, tiny_hf, tiny_llm):
    tokens = pipeline_module.whisper_tokens_for(tiny_llm.llm_engine)
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
    kwargs = dict(max_new_tokens=64, use_tqdm=False, max_in_flight=2)
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
    prompt = pipeline_module.whisper_tokens_for(tiny_llm.llm_engine).prompt()
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
                                         max_new_tokens=64, use_tqdm=False)
    prompt = pipeline_module.whisper_tokens_for(tiny_llm.llm_engine).prompt(timestamps=True)
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
                                         max_new_tokens=48, use_tqdm=False)
    tokens = pipeline_module.whisper_tokens_for(tiny_llm.llm_engine)
    first, second = window_spy[0]
    assert first.token_ids == _hf_generate(tiny_hf, fox, tokens.prompt(), 48)
    prompt_ids = [tokens.start_of_prev] + first.token_ids
    expected = _hf_generate(tiny_hf, weather, prompt_ids + tokens.prompt(), 48, prompt_ids=torch.tensor(prompt_ids))
    assert second.token_ids == expected
    assert results[0].error is None and len(results[0].segments) == 2


@pytest.fixture(scope="module")
def base_dir():
    return _resolve("whisper-base")


def test_multilingual_prompts_and_language_detection_match_hf(base_dir, speech, window_spy):
    from seq2seq_engine import LLM
    hf = transformers.WhisperForConditionalGeneration.from_pretrained(base_dir).eval()
    llm = LLM(base_dir, kv_cache_space_gb=0.4, swap_space_gb=0.01)  # room for all four requests at once
    tokens = pipeline_module.whisper_tokens_for(llm.llm_engine)
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
    results = pipeline_module.transcribe(llm, [(c, 16000) for c in clips], max_new_tokens=24, use_tqdm=False)
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
                                str(out_dir), "--timestamps", "--max-new-tokens", "48", "--quiet",
                                "--kv-cache-space-gb", "0.2"])
    assert code == 1
    assert "bad.wav" in capsys.readouterr().err
    good = json.loads((out_dir / "fox.json").read_text(encoding="utf-8"))
    failed = json.loads((out_dir / "bad.json").read_text(encoding="utf-8"))
    assert good["error"] is None and "lazy dog" in good["text"] and len(good["segments"]) >= 2
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
    code = transcribe_cli.main([fox_path, "--model", tiny_dir, "--beam-width", "3", "--max-new-tokens", "40",
                                "--quiet", "--kv-cache-space-gb", "0.2"])
    assert code == 0
    with torch.no_grad():
        sequences = tiny_hf.generate(_features(fox), num_beams=3, max_new_tokens=40)
    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_dir)
    expected = tokenizer.decode(sequences[0], skip_special_tokens=True).strip()
    assert capsys.readouterr().out.strip() == expected
