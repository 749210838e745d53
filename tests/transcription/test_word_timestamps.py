"""Word timestamps against HF transformers on real speech (pytest-audioeval clips, packaged Whisper models)."""
import json
import os

import numpy as np
import pytest
import torch
import transformers
from conftest import require_model, require_speech_clips

from seq2seq_engine.audio import load_audio
from seq2seq_engine.engine_port import AlignmentRequest
from seq2seq_engine.models.whisper_alignment import alignment_heads
from seq2seq_engine.transcription.timing.token_timing import FRAME_SECONDS, alignment_matrix, token_start_frames

pytestmark = pytest.mark.usefixtures("one_thread")

CLIPS = ["en/quick_brown_fox.wav", "en/counting.wav"]


@pytest.fixture(scope="module")
def hf_model(tiny_dir):
    model = transformers.WhisperForConditionalGeneration.from_pretrained(tiny_dir, attn_implementation="eager")
    return model.eval()


def _features(model_dir, name):
    samples = load_audio(os.path.join(require_speech_clips(), name))
    extractor = transformers.WhisperFeatureExtractor.from_pretrained(model_dir)
    return samples, extractor(samples, sampling_rate=16000, return_tensors="pt").input_features


def _heads(llm):
    engine = llm.llm_engine
    return alignment_heads(engine.model_config.hf_config, engine.generation_defaults.values)


def _text_rows(sequence, vocab_limit):
    """The rows of `sequence` predicting its text tokens (ids below vocab_limit after the prompt): a range."""
    first = next(i for i, t in enumerate(sequence) if t < vocab_limit)
    last = max(i for i, t in enumerate(sequence) if t < vocab_limit)
    return range(first - 1, last)


def _engine_pass(llm, features, sequence, vocab_limit):
    """The engine's alignment pass over `sequence`, its text rows scored: (scores, token probabilities)."""
    rows = _text_rows(sequence, vocab_limit)
    request = AlignmentRequest(features, sequence, rows.start, len(rows), vocab_limit)
    result, = llm.llm_engine.align([request])
    return result.scores, result.token_probs


def _hf_probs(logits, sequence, vocab_limit):
    """HF's probability of each text token of `sequence`, softmax over the ids below vocab_limit."""
    rows = torch.tensor(list(_text_rows(sequence, vocab_limit)))
    return logits[rows, :vocab_limit].softmax(-1)[torch.arange(len(rows)), torch.tensor(sequence)[rows + 1]]


def _hf_generate(hf_model, features):
    """(generated sequence with its prompt, HF's token timestamps [len(sequence)])."""
    with torch.no_grad():
        out = hf_model.generate(features, max_new_tokens=64, return_token_timestamps=True, output_attentions=True,
                                return_dict_in_generate=True, force_unique_generate_call=True)
    return out["sequences"][0].tolist(), out["token_timestamps"][0].numpy()


@pytest.mark.parametrize("clip", CLIPS)
def test_alignment_heads_match_hf_cross_attentions(tiny_llm, tiny_dir, hf_model, clip):
    _, features = _features(tiny_dir, clip)
    sequence, _ = _hf_generate(hf_model, features)
    heads = _heads(tiny_llm)
    assert heads == [tuple(h) for h in hf_model.generation_config.alignment_heads]
    with torch.no_grad():
        hf = hf_model(input_features=features, decoder_input_ids=torch.tensor([sequence]), output_attentions=True)
    expected = torch.stack([hf.cross_attentions[layer][0, head] for layer, head in heads])
    eot = hf_model.generation_config.eos_token_id
    scores, probs = _engine_pass(tiny_llm, features[0], sequence, eot)
    assert (scores.softmax(-1) - expected).abs().max().item() < 1e-4
    assert (probs - _hf_probs(hf.logits[0], sequence, eot)).abs().max().item() < 1e-4


@pytest.mark.parametrize("clip", CLIPS)
def test_token_timestamps_match_hf(tiny_llm, tiny_dir, hf_model, clip):
    """HF's generate-time timing (prompt rows dropped, no re-normalisation) from our weights gives HF's times."""
    _, features = _features(tiny_dir, clip)
    sequence, hf_times = _hf_generate(hf_model, features)
    scores, _ = _engine_pass(tiny_llm, features[0], sequence[:-1], hf_model.generation_config.eos_token_id)
    prompt_len = 2  # <|startoftranscript|><|notimestamps|> (English-only model, no timestamps)
    assert sequence[1] == hf_model.generation_config.no_timestamps_token_id
    matrix = alignment_matrix(scores.softmax(-1)[:, prompt_len:])
    ours = token_start_frames(matrix) * FRAME_SECONDS
    theirs = hf_times[prompt_len:prompt_len + len(ours)]
    assert np.abs(ours - theirs).max() <= FRAME_SECONDS + 1e-6
    assert np.median(np.abs(ours - theirs)) <= 1e-6


def _check_words(result, window_seconds=30.0):
    previous_end = 0.0
    for segment in result.segments:
        assert segment.words, segment
        assert "".join(word.word for word in segment.words).strip() == segment.text
        for word in segment.words:
            assert previous_end <= word.start <= word.end <= min(result.duration, window_seconds) + 1e-6
            assert 0.0 < word.probability <= 1.0
            previous_end = word.end


@pytest.mark.parametrize("timestamps", [False, True])
def test_transcribe_words_consistent_and_close_to_hf(tiny_llm, tiny_dir, hf_model, timestamps):
    from seq2seq_engine.transcription import transcribe
    differences = []
    for clip in CLIPS:
        samples, features = _features(tiny_dir, clip)
        width = None if timestamps else 1   # the default (5 beams), or greedy as HF's reference below
        result = transcribe(tiny_llm, samples, timestamps=timestamps, word_timestamps=True, beam_width=width,
                            use_tqdm=False)[0]
        _check_words(result)
        if timestamps:
            continue
        sequence, hf_times = _hf_generate(hf_model, features)
        words = [word for segment in result.segments for word in segment.words]
        assert "".join(w.word for w in words) == tiny_llm.get_tokenizer().decode(sequence[2:-1])
        spans = _hf_word_spans(tiny_llm.get_tokenizer(), sequence, hf_times, words)
        differences += [abs(word.start - start) for word, (start, _) in zip(words, spans)]
        differences += [abs(word.end - end) for word, (_, end) in zip(words, spans)]
    if differences:
        print(f"word times vs HF: median {np.median(differences):.3f} s, max {np.max(differences):.3f} s")
        assert np.median(differences) <= 0.1, differences
    manager = tiny_llm.llm_engine.scheduler.block_manager
    assert manager.get_num_free_gpu_blocks() == tiny_llm.llm_engine.cache_config.num_gpu_blocks


def _hf_word_spans(tokenizer, sequence, hf_times, words):
    """Each word's (start, end) from HF's token timestamps. HF times token p from the cross-attention row whose
    input is token p, i.e. the row that predicts token p + 1 (the time token p ends): a word starts at the time of
    the token before its first (0 after the prompt) and ends at its last token's time."""
    spans, position, text = [], 2, ""
    for word in words:
        first = position
        target = text + word.word
        while tokenizer.decode(sequence[2:position]) != target:
            position += 1
        spans.append((float(hf_times[first - 1]), float(hf_times[position - 1])))
        text = target
    return spans


FALLBACK = dict(timestamps=True, temperature=(0.0, 0.5), best_of=2, log_prob_threshold=-0.01,
                no_speech_threshold=None)  # every window fails at 0.0 and keeps its sampled attempt at 0.5


@pytest.mark.parametrize("options", [dict(beam_width=2, timestamps=True), dict(vad_filter=True, timestamps=True),
                                     dict(condition_on_previous_text=True, timestamps=True), FALLBACK])
def test_words_with_beams_vad_sequential_windows_and_fallback(tiny_llm, options):
    from seq2seq_engine.transcription import transcribe
    clips = [os.path.join(require_speech_clips(), clip) for clip in CLIPS]
    plain = transcribe(tiny_llm, clips, use_tqdm=False, **options)
    results = transcribe(tiny_llm, clips, word_timestamps=True, use_tqdm=False, **options)
    for result, reference in zip(results, plain):
        assert [s.text for s in result.segments] == [s.text for s in reference.segments]
        _check_words(result)  # the words are the kept attempt's
        if options is FALLBACK:
            assert result.segments and all(s.temperature == 0.5 for s in result.segments)
    manager = tiny_llm.llm_engine.scheduler.block_manager
    assert manager.get_num_free_gpu_blocks() == tiny_llm.llm_engine.cache_config.num_gpu_blocks


def test_multilingual_words_and_alignment_heads_match_hf():
    from seq2seq_engine import LLM
    from seq2seq_engine.transcription import transcribe
    base_dir = require_model("whisper-base")
    llm = LLM(base_dir, kv_cache_space_gb=0.3, swap_space_gb=0.01)
    clips = [os.path.join(require_speech_clips(), clip) for clip in ("es/pangrama.wav", "fr/comptage.wav")]
    results = transcribe(llm, clips, timestamps=True, word_timestamps=True, use_tqdm=False)
    assert [r.language for r in results] == ["es", "fr"]
    for result in results:
        _check_words(result)
    hf_model = transformers.WhisperForConditionalGeneration.from_pretrained(base_dir, attn_implementation="eager")
    _, features = _features(base_dir, "es/pangrama.wav")
    tokenizer = llm.get_tokenizer()
    prompt = tokenizer.convert_tokens_to_ids(["<|startoftranscript|>", "<|es|>", "<|transcribe|>", "<|notimestamps|>"])
    sequence = prompt + tokenizer.encode(" " + results[0].text, add_special_tokens=False)
    heads = _heads(llm)
    assert heads == [tuple(h) for h in hf_model.generation_config.alignment_heads]
    with torch.no_grad():
        hf = hf_model.eval()(input_features=features, decoder_input_ids=torch.tensor([sequence]),
                             output_attentions=True)
    expected = torch.stack([hf.cross_attentions[layer][0, head] for layer, head in heads])
    eot = hf_model.generation_config.eos_token_id
    scores, probs = _engine_pass(llm, features[0], sequence, eot)
    assert (scores.softmax(-1) - expected).abs().max().item() < 1e-4
    assert (probs - _hf_probs(hf.logits[0], sequence, eot)).abs().max().item() < 1e-4


def test_cli_json_words_and_word_cues(tiny_dir, capsys):
    from seq2seq_engine.entrypoints import transcribe_cli
    fox = os.path.join(require_speech_clips(), "en/quick_brown_fox.wav")
    common = ["--model", tiny_dir, "--quiet", "--kv-cache-space-gb", "0.2"]
    assert transcribe_cli.main([fox, "--word-timestamps", "--output-format", "json"] + common) == 0
    record = json.loads(capsys.readouterr().out)
    words = [w["word"] for s in record["segments"] for w in s["words"]]
    assert "".join(words).strip() == record["text"]
    assert transcribe_cli.main([fox, "--timestamps", "--max-words-per-line", "2", "--output-format", "srt"]
                               + common) == 0
    cues = capsys.readouterr().out.strip().split("\n\n")
    assert len(cues) == (len(words) + 1) // 2 and all(len(c.split("\n")[2].split()) <= 2 for c in cues)
