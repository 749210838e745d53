"""The engine around LoRA adapters: slots and admission (at most max_loras adapters in a step, a request waits for
its adapter and is never served with another), caches keyed by adapter, beam search, refusals."""
import json
import os

import pytest
import torch
from generate_reference import hf_beam_generate
from hf_reference import build_tiny_model, hf_greedy
from lora_reference import save_random_adapter

from seq2seq_engine import LLM, BeamSearchParams, LoRARequest, SamplingParams, TokensPrompt
from seq2seq_engine.errors import LoRAAdapterError

NUM_TOKENS = 10


@pytest.fixture(scope="module")
def bart(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora_engine")
    model_dir, hf_model = build_tiny_model("bart", root)
    adapters = []
    for index, targets in enumerate([["q_proj", "v_proj", "fc1"], ["k_proj", "out_proj", "fc2"]]):
        path, peft_model = save_random_adapter(hf_model, root / f"adapter{index}", 8, targets, seed=20 + index,
                                               b_scale=4.0)
        adapters.append((LoRARequest(f"a{index}", index + 1, path), peft_model))
    return model_dir, hf_model, adapters


def _llm(model_dir, **kwargs):
    kwargs = {"enable_lora": True, "max_loras": 2, **kwargs}
    return LLM(model_dir, skip_tokenizer_init=True, dtype="float32", block_size=4, kv_cache_space_gb=0.05, **kwargs)


def _greedy(llm, prompts, adapters):
    params = SamplingParams(temperature=0.0, max_tokens=NUM_TOKENS, ignore_eos=True)
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False, lora_request=adapters)]


def _encoders(num, seed=6):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(4, 256, (6 + i,), generator=generator).tolist() for i in range(num)]


def test_one_slot_serves_each_request_with_its_own_adapter(bart):
    """max_loras=1: requests of two adapters and the base queue together; each step holds one adapter at most."""
    model_dir, hf_model, adapters = bart
    encoders = _encoders(6)
    choices = [adapters[i % 3] if i % 3 < 2 else None for i in range(6)]
    llm = _llm(model_dir, max_loras=1)
    seen = []
    activate = llm.llm_engine.lora_manager.activate

    def recording_activate(ids):
        seen.append(set(ids))
        return activate(seen[-1])

    llm.llm_engine.lora_manager.activate = recording_activate
    tokens = _greedy(llm, [TokensPrompt(prompt_token_ids=e) for e in encoders], [c[0] if c else None for c in choices])
    for out, encoder, choice in zip(tokens, encoders, choices):
        reference = hf_greedy(choice[1] if choice else hf_model, torch.tensor(encoder), [2, 0], NUM_TOKENS)[0]
        assert out == reference
    assert max(len(ids) for ids in seen) == 1 and {1, 2} <= set().union(*seen)


def test_same_encoder_input_under_different_adapters_is_not_shared(bart):
    """The encoder cache and the prefix cache key by adapter: the same prompt under two adapters and the base."""
    model_dir, hf_model, adapters = bart
    encoder = _encoders(1)[0]
    llm = _llm(model_dir)
    choices = [adapters[0], adapters[1], None, adapters[0]]
    tokens = _greedy(llm, [TokensPrompt(prompt_token_ids=encoder)] * 4, [c[0] if c else None for c in choices])
    references = [hf_greedy(c[1] if c else hf_model, torch.tensor(encoder), [2, 0], NUM_TOKENS)[0] for c in choices]
    assert tokens == references
    assert len({tuple(t) for t in tokens}) == 3
    # the two requests of adapter 0 shared one encoder run: 3 distinct (content, adapter) pairs
    assert llm.llm_engine.model_runner.num_encoder_runs == 3


def test_decoder_only_prefix_cache_keys_by_adapter(tmp_path):
    model_dir, hf_model = build_tiny_model("llama", tmp_path)
    path, peft_model = save_random_adapter(hf_model, tmp_path / "adapter", 8, ["q_proj", "v_proj", "down_proj"],
                                           seed=3, b_scale=4.0)
    prompt = list(range(10, 30))    # 5 full blocks of 4: the prefix cache would hand them on
    llm = _llm(model_dir)
    adapter = LoRARequest("a", 7, path)
    first = _greedy(llm, [TokensPrompt(prompt_token_ids=prompt)], [None])
    second = _greedy(llm, [TokensPrompt(prompt_token_ids=prompt)], [adapter])
    assert first[0] == hf_greedy(hf_model, None, prompt, NUM_TOKENS)[0]
    assert second[0] == hf_greedy(peft_model, None, prompt, NUM_TOKENS)[0] != first[0]


def test_beam_search_matches_peft(bart):
    model_dir, hf_model, adapters = bart
    encoders = _encoders(3, seed=9)
    llm = _llm(model_dir)
    params = BeamSearchParams(beam_width=3, max_tokens=NUM_TOKENS, early_stopping=True)
    outputs = llm.beam_search([TokensPrompt(prompt_token_ids=e) for e in encoders], params, use_tqdm=False,
                              lora_request=[adapters[0][0], None, adapters[1][0]])
    for output, encoder, model in zip(outputs, encoders, [adapters[0][1], hf_model, adapters[1][1]]):
        reference = hf_beam_generate(model, encoder, [2, 0], num_beams=3, num_return_sequences=3,
                                     max_new_tokens=NUM_TOKENS, length_penalty=1.0, early_stopping=True,
                                     forced_eos_token_id=None)
        assert [c.token_ids for c in output.outputs] == [tokens for tokens, _ in reference]


def _write_adapter(folder, config=None, tensors=None):
    from safetensors.torch import save_file
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "adapter_config.json"), "w") as handle:
        json.dump({"peft_type": "LORA", "r": 8, "lora_alpha": 16, **(config or {})}, handle)
    if tensors is not None:
        save_file(tensors, os.path.join(folder, "adapter_model.safetensors"))
    return str(folder)


@pytest.mark.parametrize("case,message", [
    ("missing", "no such directory"),
    ("no_weights", "adapter_model.safetensors is missing"),
    ("dora", "DoRA"),
    ("embedding", "'model.shared': LoRA on an embedding"),
    ("head", "'lm_head' cannot be adapted: LoRA on the logits head"),
    ("unknown", "'model.decoder.layers.0.self_attn.nope' cannot be adapted: it is not a linear"),
    ("rank", "rank 32, above max_lora_rank 16"),
    ("shape", "an adapter of another base model"),
])
def test_adapters_that_cannot_be_served_are_refused_by_name(bart, tmp_path, case, message):
    model_dir = bart[0]
    a, b = torch.randn(8, 64), torch.randn(64, 8)
    prefix = "base_model.model.model.decoder.layers.0.self_attn"
    folders = {
        "missing": lambda: str(tmp_path / "nothing"),
        "no_weights": lambda: _write_adapter(tmp_path / "w"),
        "dora": lambda: _write_adapter(tmp_path / "d", {"use_dora": True}, {}),
        "embedding": lambda: _write_adapter(tmp_path / "e", tensors={
            "base_model.model.model.shared.lora_embedding_A": a, "base_model.model.model.shared.lora_embedding_B": b}),
        "head": lambda: _write_adapter(tmp_path / "h", tensors={
            "base_model.model.lm_head.lora_A.weight": a,
            "base_model.model.lm_head.lora_B.weight": torch.randn(256, 8)}),
        "unknown": lambda: _write_adapter(tmp_path / "u", tensors={
            f"{prefix}.nope.lora_A.weight": a, f"{prefix}.nope.lora_B.weight": b}),
        "rank": lambda: _write_adapter(tmp_path / "r", tensors={
            f"{prefix}.q_proj.lora_A.weight": torch.randn(32, 64),
            f"{prefix}.q_proj.lora_B.weight": torch.randn(64, 32)}),
        "shape": lambda: _write_adapter(tmp_path / "s", tensors={
            f"{prefix}.q_proj.lora_A.weight": torch.randn(8, 48), f"{prefix}.q_proj.lora_B.weight": b}),
    }
    llm = _llm(model_dir)
    with pytest.raises(LoRAAdapterError, match=message) as raised:
        llm.generate([TokensPrompt(prompt_token_ids=[5, 6, 7])], SamplingParams(max_tokens=2), use_tqdm=False,
                     lora_request=LoRARequest("bad", 3, folders[case]()))
    assert raised.value.param == "lora_request"
    assert not llm.llm_engine.has_unfinished_requests()
    free = llm.llm_engine.scheduler.block_manager.get_num_free_gpu_blocks()
    assert free == llm.llm_engine.cache_config.num_gpu_blocks


def test_lora_request_needs_enable_lora_and_valid_fields(bart):
    model_dir, _, adapters = bart
    llm = LLM(model_dir, skip_tokenizer_init=True, dtype="float32", block_size=4, kv_cache_space_gb=0.05)
    with pytest.raises(ValueError, match="enable_lora=True"):
        llm.generate([TokensPrompt(prompt_token_ids=[5])], use_tqdm=False, lora_request=adapters[0][0])
    with pytest.raises(TypeError, match="lora_request must be a LoRARequest"):
        llm.generate([TokensPrompt(prompt_token_ids=[5])], use_tqdm=False, lora_request="a0")
    with pytest.raises(ValueError, match="lora_int_id must be an int >= 1"):
        LoRARequest("x", 0, "/tmp")
    with pytest.raises(ValueError, match="max_lora_rank must be one of"):
        LLM(model_dir, skip_tokenizer_init=True, enable_lora=True, max_lora_rank=12)


@pytest.mark.parametrize("precision", [{"dtype": "bfloat16"}, {"quantization": "int8"}])
def test_bfloat16_and_int8_base_models_take_float_adapters(bart, precision):
    """The slots hold the compute dtype (bfloat16, or float32 under int8): the adapter still moves the tokens its
    PEFT reference moves, to the rounding of the base model's precision."""
    model_dir, hf_model, adapters = bart
    encoders = _encoders(4, seed=11)
    llm = LLM(model_dir, skip_tokenizer_init=True, block_size=4, kv_cache_space_gb=0.05, enable_lora=True, **precision)
    tokens = _greedy(llm, [TokensPrompt(prompt_token_ids=e) for e in encoders], adapters[0][0])
    references = [hf_greedy(adapters[0][1], torch.tensor(e), [2, 0], NUM_TOKENS)[0] for e in encoders]
    base = [hf_greedy(hf_model, torch.tensor(e), [2, 0], NUM_TOKENS)[0] for e in encoders]
    assert sum(t[0] == r[0] for t, r in zip(tokens, references)) >= 3
    assert sum(t[0] == b[0] for t, b in zip(tokens, base)) < sum(t[0] == r[0] for t, r in zip(tokens, references))


def test_families_without_lora_are_refused_at_start_up(tmp_path):
    model_dir, _ = build_tiny_model("gpt2", tmp_path)
    with pytest.raises(ValueError, match="GPT2LMHeadModel does not serve LoRA adapters"):
        LLM(model_dir, skip_tokenizer_init=True, kv_cache_space_gb=0.05, enable_lora=True)


def test_an_id_registered_again_never_finds_the_removed_adapters_cached_blocks(tmp_path):
    """remove_lora then the same lora_int_id for another adapter: the prefix cache keys by registration, not id."""
    model_dir, hf_model = build_tiny_model("llama", tmp_path)
    paths = [save_random_adapter(hf_model, tmp_path / f"adapter{i}", 8, ["q_proj", "v_proj", "down_proj"], seed=40 + i,
                                 b_scale=4.0) for i in range(2)]
    prompt = list(range(10, 30))
    llm = _llm(model_dir)
    first = _greedy(llm, [TokensPrompt(prompt_token_ids=prompt)], [LoRARequest("a", 1, paths[0][0])])
    assert llm.llm_engine.remove_lora(1)
    second = _greedy(llm, [TokensPrompt(prompt_token_ids=prompt)], [LoRARequest("b", 1, paths[1][0])])
    assert first[0] == hf_greedy(paths[0][1], None, prompt, NUM_TOKENS)[0]
    assert second[0] == hf_greedy(paths[1][1], None, prompt, NUM_TOKENS)[0]
    assert [r.lora_name for r in llm.llm_engine.list_loras()] == ["b"]
