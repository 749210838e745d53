"""model_loader: checkpoint formats (single/sharded safetensors, pytorch_model.bin), dtype casting, strict weight
checks and clear errors; the architecture registry."""
import json
import types

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

from seq2seq_engine.model_loader.loader import load_model, weight_files
from seq2seq_engine.models.registry import MODEL_REGISTRY, resolve_model_class

CONFIG = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=64, initializer_range=0.2, pad_token_id=0,
              bos_token_id=1, eos_token_id=2)
PROMPT = [5, 17, 33, 9, 100, 64]


@pytest.fixture(scope="module")
def hf_model():
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**CONFIG)).eval()


@torch.no_grad()
def _prefill_logits(model):
    from model_test_utils import prefill_metadata

    md = prefill_metadata([len(PROMPT)], block_size=4, block_tables=[[0, 1]])
    ids, positions = torch.tensor(PROMPT), torch.arange(len(PROMPT))
    return model.compute_logits(model(ids, positions, None, md))


@torch.no_grad()
def _check_matches(model, hf_model, tol=1e-4):
    expected = hf_model(torch.tensor([PROMPT])).logits[0]
    assert (_prefill_logits(model) - expected).abs().max().item() < tol


def test_single_safetensors(tmp_path, hf_model):
    hf_model.save_pretrained(tmp_path)
    assert weight_files(str(tmp_path))[1] == [str(tmp_path / "model.safetensors")]
    model, config = load_model(tmp_path, torch.float32, "cpu")
    assert type(model).__name__ == "LlamaForCausalLM" and config.architectures == ["LlamaForCausalLM"]
    assert not model.training
    _check_matches(model, hf_model)


def test_sharded_safetensors(tmp_path, hf_model):
    hf_model.save_pretrained(tmp_path, max_shard_size="50KB")
    kind, files = weight_files(str(tmp_path))
    assert kind == "safetensors" and len(files) > 1
    assert (tmp_path / "model.safetensors.index.json").exists() and not (tmp_path / "model.safetensors").exists()
    model, _ = load_model(str(tmp_path), torch.float32, "cpu")
    _check_matches(model, hf_model)


def test_pytorch_bin(tmp_path, hf_model):
    hf_model.save_pretrained(tmp_path, safe_serialization=False)
    kind, files = weight_files(str(tmp_path))
    if not (tmp_path / "pytorch_model.bin").exists() and not (tmp_path / "pytorch_model.bin.index.json").exists():
        # transformers 5 may always write safetensors; write the legacy format by hand.
        state = {k: v.clone() for k, v in load_file(files[0]).items()}
        for path in files:
            (tmp_path / path.rsplit("/", 1)[-1]).unlink()
        torch.save(state, tmp_path / "pytorch_model.bin")
    kind, files = weight_files(str(tmp_path))
    assert kind == "pytorch"
    model, _ = load_model(tmp_path, torch.float32, "cpu")
    _check_matches(model, hf_model)


@pytest.mark.parametrize("zipfile", [True, False], ids=["zip", "legacy"])
def test_sharded_pytorch_bin(tmp_path, hf_model, zipfile):
    state = {k: v.clone() for k, v in hf_model.state_dict().items()}
    names = sorted(state)
    half = len(names) // 2
    shards = {"pytorch_model-00001-of-00002.bin": names[:half], "pytorch_model-00002-of-00002.bin": names[half:]}
    weight_map = {}
    for file_name, keys in shards.items():
        torch.save({k: state[k] for k in keys}, tmp_path / file_name, _use_new_zipfile_serialization=zipfile)
        weight_map.update({k: file_name for k in keys})
    (tmp_path / "pytorch_model.bin.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    hf_model.config.save_pretrained(tmp_path)
    model, _ = load_model(tmp_path, torch.float32, "cpu")
    _check_matches(model, hf_model)


def test_dtype_cast(tmp_path, hf_model):
    hf_model.save_pretrained(tmp_path)
    model, _ = load_model(tmp_path, torch.bfloat16, "cpu")
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    assert model.rotary_emb.inv_freq.dtype == torch.float32  # rotary frequencies stay exact
    logits = _prefill_logits(model)
    assert logits.dtype == torch.float32
    expected = hf_model(torch.tensor([PROMPT])).logits[0]
    assert (logits - expected).abs().max().item() < 0.5  # bf16 rounding only


def _rewrite_checkpoint(model_dir, edit):
    path = model_dir / "model.safetensors"
    state = load_file(path)
    edit(state)
    save_file(state, path, metadata={"format": "pt"})


def test_missing_tensor(tmp_path, hf_model):
    hf_model.save_pretrained(tmp_path)
    _rewrite_checkpoint(tmp_path, lambda s: s.pop("model.layers.1.self_attn.k_proj.weight"))
    with pytest.raises(ValueError, match=r"missing.*model\.layers\.1\.self_attn\.qkv_proj\.weight"):
        load_model(tmp_path, torch.float32, "cpu")


def test_missing_untied_lm_head(tmp_path, hf_model):
    hf_model.save_pretrained(tmp_path)
    _rewrite_checkpoint(tmp_path, lambda s: s.pop("lm_head.weight"))
    with pytest.raises(ValueError, match=r"missing.*lm_head\.weight"):
        load_model(tmp_path, torch.float32, "cpu")


def test_shape_mismatch(tmp_path, hf_model):
    hf_model.save_pretrained(tmp_path)

    def edit(state):
        state["model.layers.0.mlp.up_proj.weight"] = state["model.layers.0.mlp.up_proj.weight"][:, :32].clone()
    _rewrite_checkpoint(tmp_path, edit)
    with pytest.raises(ValueError, match=r"shape mismatch.*model\.layers\.0\.mlp\.up_proj\.weight"):
        load_model(tmp_path, torch.float32, "cpu")


def test_unexpected_tensor(tmp_path, hf_model):
    hf_model.save_pretrained(tmp_path)
    _rewrite_checkpoint(tmp_path, lambda s: s.update({"model.layers.0.extra.weight": torch.zeros(3)}))
    with pytest.raises(ValueError, match=r"unexpected.*model\.layers\.0\.extra\.weight"):
        load_model(tmp_path, torch.float32, "cpu")


def test_rotary_buffer_in_checkpoint_is_ignored(tmp_path, hf_model):
    hf_model.save_pretrained(tmp_path)
    _rewrite_checkpoint(tmp_path, lambda s: s.update({"model.layers.0.self_attn.rotary_emb.inv_freq": torch.ones(8)}))
    model, _ = load_model(tmp_path, torch.float32, "cpu")
    _check_matches(model, hf_model)


def test_unknown_architecture(tmp_path, hf_model):
    hf_model.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["architectures"] = ["LlamaForSequenceClassification"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"unsupported.*LlamaForSequenceClassification.*LlamaForCausalLM"):
        load_model(tmp_path, torch.float32, "cpu")


def test_missing_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_model(tmp_path / "nope", torch.float32, "cpu")


def test_missing_config(tmp_path):
    with pytest.raises(FileNotFoundError, match="no config.json"):
        load_model(tmp_path, torch.float32, "cpu")


def test_no_weight_files(tmp_path, hf_model):
    hf_model.config.save_pretrained(tmp_path)
    with pytest.raises(FileNotFoundError, match="no weight files"):
        load_model(tmp_path, torch.float32, "cpu")


def test_registry_is_immutable_and_complete():
    assert isinstance(MODEL_REGISTRY, types.MappingProxyType)
    with pytest.raises(TypeError):
        MODEL_REGISTRY["X"] = "y:Z"
    for name in ("LlamaForCausalLM", "GPT2LMHeadModel", "OPTForCausalLM", "BartForConditionalGeneration",
                 "MBartForConditionalGeneration", "WhisperForConditionalGeneration"):
        assert name in MODEL_REGISTRY
    assert resolve_model_class(["Unknown", "GPT2LMHeadModel"]).__name__ == "GPT2LMHeadModel"
    with pytest.raises(ValueError, match="supported architectures"):
        resolve_model_class(None)


def test_weight_loader_shards_duplicates_and_coverage():
    from torch import nn

    from seq2seq_engine.models.utils import WeightLoader

    module = nn.Linear(4, 6)
    loader = WeightLoader(module)
    loader.load("weight", torch.ones(2, 4), source="q.weight", shard=(0, 2))
    with pytest.raises(ValueError, match="k.weight.*second time"):
        loader.load("weight", torch.ones(2, 4), source="k.weight", shard=(1, 2))
    loader.load("weight", torch.full((4, 4), 2.0), source="kv.weight", shard=(2, 4))
    with pytest.raises(ValueError, match=r"missing.*bias"):
        loader.finish()
    loader.load("bias", torch.zeros(6), source="b")
    loader.finish()
    assert module.weight[:2].eq(1).all() and module.weight[2:].eq(2).all()

    partial = WeightLoader(nn.Linear(4, 6, bias=False))
    partial.load("weight", torch.ones(2, 4), shard=(0, 2))
    with pytest.raises(ValueError, match=r"weight \(partly loaded"):
        partial.finish()
