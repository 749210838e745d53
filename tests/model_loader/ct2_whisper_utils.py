"""Test-side CTranslate2 Whisper writer (model.bin v6) and synthetic model directories, and the tokenizer checks
every converted Whisper tokenizer must pass."""
import json
import os
import struct

import torch
import transformers

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


def check_tokenizer_fixes(tokenizer):
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
