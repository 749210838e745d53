"""Prepared weights (model_loader/prepared_cache.py): the first CPU load writes the prepared model's tensors, later
loads memory-map them and build the same model (same tensors, layers and attributes, same logits, same generated
tokens) without packing or quantizing again; a changed checkpoint prepares again; a file that does not fit is
refused and left alone; the file format keeps every tensor 64-byte aligned."""
import json
import os

import pytest
import torch
from hf_reference import build_tiny_model
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from t5_reference import build_tiny_t5

from seq2seq_engine.model_loader import prepared_cache
from seq2seq_engine.model_loader.loader import load_model
from seq2seq_engine.model_loader.prepared_cache import PreparedWeights, prune_prepared, write_aligned_safetensors
from seq2seq_engine.model_loader.prepared_checksum import CHECKSUM_KEY, checksum
from seq2seq_engine.model_loader.prepared_state import describe, snapshot
from seq2seq_engine.models.int8 import int8_unsupported_reason

QUANTIZATIONS = [None, pytest.param("int8", marks=pytest.mark.skipif(int8_unsupported_reason("cpu") is not None,
                                                                     reason="no fbgemm in this torch build"))]
PROMPT = [5, 17, 33, 9, 100, 64]


def _prepared_files(cache_dir):
    folder = os.path.join(cache_dir, "prepared")
    return sorted(os.listdir(folder)) if os.path.isdir(folder) else []


def _same_model(ours, reference):
    assert describe(ours) == describe(reference)
    (layout, tensors), (ref_layout, ref_tensors) = snapshot(ours), snapshot(reference)
    assert layout == ref_layout and tensors.keys() == ref_tensors.keys()
    for name, tensor in tensors.items():
        assert tensor.dtype == ref_tensors[name].dtype and torch.equal(tensor, ref_tensors[name]), name


def _refuse_preparing(monkeypatch):
    """Packing or quantizing again would fail the test: a prepared load must not do either."""
    def refuse(*args, **kwargs):
        raise AssertionError("a prepared load packed or quantized weights again")
    monkeypatch.setattr("seq2seq_engine.models.packed_linear.to_panels", refuse)
    monkeypatch.setattr("seq2seq_engine.models.int8.quantize_weight", refuse)


@pytest.mark.parametrize("quantization", QUANTIZATIONS)
@pytest.mark.parametrize("arch", ["bart", "whisper", "llama", "t5"])
def test_second_load_is_the_prepared_model(tmp_path, monkeypatch, arch, quantization):
    if arch == "t5":
        model_dir, _ = build_tiny_t5("t5", tmp_path)
    else:
        model_dir, _ = build_tiny_model(arch, tmp_path)
    cache_dir = str(tmp_path / "cache")
    reference, _ = load_model(model_dir, quantization=quantization)
    first, _ = load_model(model_dir, quantization=quantization, prepared=True, cache_dir=cache_dir)
    assert len(_prepared_files(cache_dir)) == 1
    _refuse_preparing(monkeypatch)
    second, _ = load_model(model_dir, quantization=quantization, prepared=True, cache_dir=cache_dir)
    _same_model(first, reference)
    _same_model(second, reference)
    assert all(tensor.data_ptr() % prepared_cache.ALIGNMENT == 0 for tensor in snapshot(second)[1].values())
    if arch == "llama":
        from model_test_utils import prefill_metadata
        md = prefill_metadata([len(PROMPT)], block_size=4, block_tables=[[0, 1]])
        ids, positions = torch.tensor(PROMPT), torch.arange(len(PROMPT))
        with torch.no_grad():
            logits = [m.compute_logits(m(ids, positions, None, md)) for m in (reference, second)]
        assert torch.equal(logits[0], logits[1])


def test_changed_checkpoint_prepares_again(tmp_path):
    model_dir, _ = build_tiny_model("bart", tmp_path)
    cache_dir = str(tmp_path / "cache")
    load_model(model_dir, prepared=True, cache_dir=cache_dir)
    path = os.path.join(model_dir, "model.safetensors")
    weights = load_file(path)
    weights = {name: tensor * 2 if tensor.is_floating_point() else tensor for name, tensor in weights.items()}
    save_file(weights, path, metadata={"format": "pt"})
    os.utime(path, ns=(1, 1))   # a different mtime even on a coarse clock
    reloaded, _ = load_model(model_dir, prepared=True, cache_dir=cache_dir)
    _same_model(reloaded, load_model(model_dir)[0])
    assert len(_prepared_files(cache_dir)) == 1    # the slot was written again, not added to


def test_a_file_that_does_not_fit_is_refused_and_kept(tmp_path, caplog):
    model_dir, _ = build_tiny_model("bart", tmp_path)
    cache_dir = str(tmp_path / "cache")
    load_model(model_dir, prepared=True, cache_dir=cache_dir)
    cache = PreparedWeights(model_dir, [os.path.join(model_dir, "model.safetensors")], torch.float32, None, None,
                            cache_dir)
    with safe_open(cache.path, framework="pt") as handle:
        metadata = handle.metadata()
        tensors = {name: handle.get_tensor(name) for name in handle.keys()
                   if not name.startswith(prepared_cache.PAD_PREFIX)}
    tensors.pop(sorted(tensors)[0])
    metadata[CHECKSUM_KEY] = checksum(metadata, tensors)   # whole, as written by code that prepared otherwise
    write_aligned_safetensors(cache.path + ".new", tensors, metadata)
    os.replace(cache.path + ".new", cache.path)   # never in place: the loaded models map the old file
    written = os.path.getmtime(cache.path)
    model, _ = load_model(model_dir, prepared=True, cache_dir=cache_dir)
    assert "do not fit" in caplog.text
    _same_model(model, load_model(model_dir)[0])
    assert os.path.getmtime(cache.path) == written


def test_a_damaged_file_is_prepared_again(tmp_path, caplog):
    model_dir, _ = build_tiny_model("bart", tmp_path)
    cache_dir = str(tmp_path / "cache")
    load_model(model_dir, prepared=True, cache_dir=cache_dir)
    path = os.path.join(cache_dir, "prepared", _prepared_files(cache_dir)[0])
    with open(path + ".new", "wb") as handle:
        handle.write(b"not a safetensors file")
    os.replace(path + ".new", path)
    model, _ = load_model(model_dir, prepared=True, cache_dir=cache_dir)
    assert "unreadable" in caplog.text
    _same_model(model, load_model(model_dir)[0])
    with safe_open(path, framework="pt") as handle:   # written again, whole
        assert handle.metadata()["model_dir"] == os.path.abspath(model_dir)


def test_a_file_that_cannot_be_written_does_not_fail_the_load(tmp_path, monkeypatch, caplog):
    model_dir, _ = build_tiny_model("bart", tmp_path)
    cache_dir = str(tmp_path / "cache")
    monkeypatch.setattr(prepared_cache, "_DTYPE_NAMES", {})   # no dtype the writer knows
    model, _ = load_model(model_dir, prepared=True, cache_dir=cache_dir)
    assert "could not write prepared weights" in caplog.text and not _prepared_files(cache_dir)
    _same_model(model, load_model(model_dir)[0])


def test_aligned_safetensors_round_trip(tmp_path):
    tensors = {"a": torch.arange(3, dtype=torch.int8), "b": torch.randn(5, 7),
               "c": torch.randn(3, 3).to(torch.bfloat16), "d": torch.tensor([True, False]),
               "e": torch.empty(0, 4), "f": torch.arange(11, dtype=torch.int32)}
    path = str(tmp_path / "x.safetensors")
    write_aligned_safetensors(path, tensors, {"format": "pt", "note": "hello"})
    with safe_open(path, framework="pt") as handle:
        assert handle.metadata()["note"] == "hello"
        loaded = {name: handle.get_tensor(name) for name in handle.keys()
                  if not name.startswith(prepared_cache.PAD_PREFIX)}
    assert loaded.keys() == tensors.keys()
    for name, tensor in tensors.items():
        assert loaded[name].dtype == tensor.dtype and torch.equal(loaded[name], tensor)
        assert loaded[name].numel() == 0 or loaded[name].data_ptr() % prepared_cache.ALIGNMENT == 0


def test_pruning_keeps_the_recent_files_of_existing_models(tmp_path):
    folder = tmp_path / "prepared"
    folder.mkdir()
    kept_dir = tmp_path / "kept"
    kept_dir.mkdir()
    files = [("gone", tmp_path / "gone")] + [(f"kept{i}", kept_dir) for i in range(3)]
    for age, (name, model_dir) in enumerate(reversed(files)):
        path = str(folder / f"{name}.safetensors")
        write_aligned_safetensors(path, {"x": torch.zeros(2)},
                                  {"format": "pt", "model_dir": str(model_dir), "layout": json.dumps({})})
        os.utime(path, (1000 - age, 1000 - age))   # kept2 newest ... gone oldest
    temporary = folder / ".preparing-x.safetensors"
    temporary.write_bytes(b"partial")
    os.utime(temporary, (0, 0))
    prune_prepared(str(folder), per_model=2)
    assert sorted(os.listdir(folder)) == ["kept1.safetensors", "kept2.safetensors"]


def test_engine_outputs_are_identical_from_prepared_weights(tmp_path, monkeypatch):
    from seq2seq_engine import LLM, SamplingParams
    model_dir, _ = build_tiny_model("bart", tmp_path)
    monkeypatch.setenv("SEQ2SEQ_ENGINE_CACHE", str(tmp_path / "cache"))
    params = SamplingParams(max_tokens=12, temperature=0.0)
    prompts = [{"prompt_token_ids": [0, 15, 27, 2]}, {"prompt_token_ids": [0, 8, 9, 10, 11, 2]}]
    outputs = []
    for _ in range(2):
        llm = LLM(model_dir, skip_tokenizer_init=True, kv_cache_space_gb=0.01, swap_space_gb=0.001)
        outputs.append([out.outputs[0].token_ids for out in llm.generate(prompts, params, use_tqdm=False)])
    assert _prepared_files(str(tmp_path / "cache"))
    assert outputs[0] == outputs[1]
