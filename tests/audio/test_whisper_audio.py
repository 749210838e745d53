"""Audio prompts through LLM.generate on a tiny random Whisper: the engine's own front end (load, resample,
log-mel) then decoding must equal HF's WhisperFeatureExtractor + greedy decoding."""
import numpy as np
import pytest
import torch
import transformers
from hf_reference import build_tiny_model, hf_greedy

from seq2seq_engine import LLM, SamplingParams
from seq2seq_engine.audio import AudioError


def _hf_features(audio, config):
    seconds = 2 * config.max_source_positions * 160 // 16000
    extractor = transformers.WhisperFeatureExtractor(feature_size=config.num_mel_bins, chunk_length=seconds)
    return torch.from_numpy(extractor(audio, sampling_rate=16000, return_tensors="np").input_features[0])


def test_audio_prompts_match_hf_feature_extractor_and_greedy(tmp_path):
    model_dir, hf_model = build_tiny_model("whisper", tmp_path)
    config = hf_model.config
    rng = np.random.default_rng(0)
    clips = [rng.standard_normal(n).astype(np.float32) * 0.1 for n in (16000, 9000, 23000)]
    prompts = [{"prompt_token_ids": [config.decoder_start_token_id, 5 + i],
                "multi_modal_data": {"audio": (clip, 16000)}} for i, clip in enumerate(clips)]
    llm = LLM(model_dir, skip_tokenizer_init=True, kv_cache_space_gb=0.05, block_size=8)
    outputs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True),
                           use_tqdm=False)
    for i, (clip, output) in enumerate(zip(clips, outputs)):
        expected, _ = hf_greedy(hf_model, _hf_features(clip, config), [config.decoder_start_token_id, 5 + i], 12,
                                features=True)
        assert output.outputs[0].token_ids == expected


def test_bad_audio_is_a_clear_error_and_leaks_nothing(tmp_path):
    model_dir, hf_model = build_tiny_model("whisper", tmp_path)
    llm = LLM(model_dir, skip_tokenizer_init=True, kv_cache_space_gb=0.05)
    bad = np.full(1600, np.nan, dtype=np.float32)
    with pytest.raises(AudioError, match="NaN"):
        llm.generate({"prompt_token_ids": [3], "multi_modal_data": {"audio": (bad, 16000)}}, use_tqdm=False)
    assert not llm.llm_engine.has_unfinished_requests()


def test_audio_far_above_full_scale_transcribes_as_the_same_audio_at_full_scale():
    """A clip scaled by 1e6 (integer-range floats, a gain error) decodes like the clip at a peak of 1.0, not into
    garbage (whisper tiny.en, real weights)."""
    import os

    import soundfile as sf
    from conftest import require_model, require_speech_clips
    samples, rate = sf.read(os.path.join(require_speech_clips(), "en", "quick_brown_fox.wav"), dtype="float32")
    llm = LLM(require_model("whisper-tiny.en"), kv_cache_space_gb=0.3)
    loud, full_scale = llm.transcribe([(samples * np.float32(1e6), rate),
                                       (samples / np.abs(samples).max(), rate)], use_tqdm=False)
    assert loud.text == full_scale.text and "fox" in loud.text.lower()
