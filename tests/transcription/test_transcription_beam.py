"""Beam-search transcription (`transcribe(..., beam_width=N, temperature=0.0)`) against HF
`WhisperForConditionalGeneration.generate(num_beams=N)` on real speech (pytest-audioeval clips) with the packaged
Whisper models: the window tokens must be identical, with and without timestamps, English-only and multilingual
(language detected by us, given to HF)."""
import glob
import os

import pytest
import torch
import transformers
from conftest import require_model, require_speech_clips

from seq2seq_engine.audio import load_audio
from seq2seq_engine.transcription.prompts import whisper_tokens_for

pytestmark = pytest.mark.usefixtures("one_thread")


def _clips(names):
    folder = require_speech_clips()
    paths = {os.path.relpath(p, folder): p for p in glob.glob(os.path.join(folder, "*", "*.wav"))}
    return [load_audio(paths[name]) for name in names]


def _hf_beam(model, model_dir, samples, prompt, beams, timestamps, **kwargs):
    """HF's beam-search tokens after the prompt (eos dropped); checks that HF's decoder prompt equals ours."""
    extractor = transformers.WhisperFeatureExtractor.from_pretrained(model_dir)
    features = extractor(samples, sampling_rate=16000, return_tensors="pt").input_features
    with torch.no_grad():
        out = model.generate(features, num_beams=beams, max_new_tokens=64, return_timestamps=timestamps,
                             return_dict_in_generate=True, force_unique_generate_call=True, **kwargs)
    sequence = out.sequences[0].tolist()
    assert sequence[:len(prompt)] == prompt
    tokens = sequence[len(prompt):]
    return tokens[:-1] if tokens and tokens[-1] == model.generation_config.eos_token_id else tokens


@pytest.mark.parametrize("timestamps", [False, True])
def test_beam_search_windows_match_hf_english_only(tiny_dir, tiny_llm, window_tokens, timestamps):
    model_dir, llm = tiny_dir, tiny_llm
    clips = _clips(["en/counting.wav", "en/hello_world.wav", "en/quick_brown_fox.wav"])
    hf = transformers.WhisperForConditionalGeneration.from_pretrained(model_dir).eval()
    prompt = whisper_tokens_for(llm.llm_engine).prompt(timestamps=timestamps)
    results = llm.transcribe([(c, 16000) for c in clips], beam_width=5, timestamps=timestamps, max_new_tokens=64,
                             use_tqdm=False, temperature=0.0)
    assert all(r.error is None for r in results)
    for samples, windows in zip(clips, window_tokens):
        expected = _hf_beam(hf, model_dir, samples, prompt, 5, timestamps)
        assert len(expected) > 2
        assert windows == [expected]


def test_beam_search_windows_match_hf_multilingual_detected_language(window_tokens):
    from seq2seq_engine import LLM
    model_dir = require_model("whisper-base")
    clips = _clips(["es/pangrama.wav", "fr/comptage.wav", "ja/pangrama.wav", "en/counting.wav"])
    llm = LLM(model_dir, kv_cache_space_gb=0.4, swap_space_gb=0.01)
    hf = transformers.WhisperForConditionalGeneration.from_pretrained(model_dir).eval()
    tokens = whisper_tokens_for(llm.llm_engine)
    results = llm.transcribe([(c, 16000) for c in clips], beam_width=4, max_new_tokens=64, use_tqdm=False,
                             temperature=0.0)
    assert [r.language for r in results] == ["es", "fr", "ja", "en"]
    greedy = llm.transcribe([(c, 16000) for c in clips], max_new_tokens=64, use_tqdm=False, temperature=0.0,
                            beam_width=1)
    for result, samples, windows in zip(results, clips, window_tokens):
        expected = _hf_beam(hf, model_dir, samples, tokens.prompt(result.language), 4, False,
                            language=result.language, task="transcribe")
        assert windows == [expected]
    # Beam search changes some transcripts here (e.g. the English counting clip): it is not greedy under another name.
    assert [r.text for r in results] != [r.text for r in greedy]


@pytest.mark.parametrize("bad", [0, -1, True, 2.5, "5", 17])
def test_beam_width_must_be_a_positive_int_within_max_beam_width(tiny_llm, bad):
    assert tiny_llm.llm_engine.scheduler_config.max_beam_width == 16
    with pytest.raises(ValueError, match="beam_width"):
        tiny_llm.transcribe([(torch.zeros(16000).numpy(), 16000)], beam_width=bad, use_tqdm=False)
