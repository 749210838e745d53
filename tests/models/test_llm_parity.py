"""LLM.generate against HF transformers on random-initialised checkpoints: identical greedy tokens and
top-1 logprobs within 1e-4 (float32), also with a KV pool small enough to force preemption."""
import pytest
import torch
from hf_reference import build_tiny_model, hf_greedy

from seq2seq_engine import LLM, SamplingParams, TokensPrompt
from seq2seq_engine.inputs.data import ExplicitEncoderDecoderPrompt

NUM_TOKENS = 32


def _decoder_only_prompts(vocab_size, generator):
    lengths = [3, 17, 5, 30, 9, 1, 24, 12]
    return [torch.randint(4, vocab_size, (n,), generator=generator).tolist() for n in lengths]


@pytest.fixture(scope="module")
def cached():
    """Checkpoints and HF references are built once per architecture and shared by the engine variants."""
    return {}


def _cached(cache, key, build):
    if key not in cache:
        cache[key] = build()
    return cache[key]


def _run_llm(model_dir, prompts, **engine_kwargs):
    llm = LLM(model_dir, skip_tokenizer_init=True, dtype="float32", block_size=engine_kwargs.pop("block_size", 4),
              kv_cache_space_gb=0.05, **engine_kwargs)
    params = SamplingParams(temperature=0.0, max_tokens=NUM_TOKENS, ignore_eos=True, logprobs=0)
    outputs = llm.generate(prompts, params, use_tqdm=False)
    assert llm.llm_engine.scheduler.block_manager.get_num_free_gpu_blocks() == \
        llm.llm_engine.cache_config.num_gpu_blocks
    return outputs, llm


def _assert_matches(outputs, references):
    for output, (ref_tokens, ref_logprobs) in zip(outputs, references):
        completion = output.outputs[0]
        assert completion.token_ids == ref_tokens
        ours = torch.tensor([lp[t] for lp, t in zip(completion.logprobs, completion.token_ids)])
        assert torch.allclose(ours, torch.tensor(ref_logprobs), atol=1e-4)
        assert completion.finish_reason == "length"


ENGINE_VARIANTS = {
    "roomy": {},
    "recompute": {"num_gpu_blocks_override": 40, "preemption_mode": "recompute"},
    "swap": {"num_gpu_blocks_override": 40, "preemption_mode": "swap"},
}


def _decoder_only_case(arch, tmp_path_factory):
    model_dir, hf_model = build_tiny_model(arch, tmp_path_factory.mktemp(arch))
    prompts = _decoder_only_prompts(hf_model.config.vocab_size, torch.Generator().manual_seed(1))
    return model_dir, prompts, [hf_greedy(hf_model, None, p, NUM_TOKENS) for p in prompts]


@pytest.mark.parametrize("arch,variant", [("llama", v) for v in ENGINE_VARIANTS]
                         + [("gpt2", "roomy"), ("gpt2", "swap"), ("opt", "roomy"), ("opt", "recompute")])
def test_decoder_only_parity(arch, variant, cached, tmp_path_factory):
    model_dir, prompts, references = _cached(cached, arch, lambda: _decoder_only_case(arch, tmp_path_factory))
    outputs, llm = _run_llm(model_dir, [TokensPrompt(prompt_token_ids=p) for p in prompts],
                            **ENGINE_VARIANTS[variant])
    _assert_matches(outputs, references)
    if variant != "roomy":
        assert llm.llm_engine.scheduler.num_cumulative_preemption > 0


def _bart_case(tmp_path_factory):
    model_dir, hf_model = build_tiny_model("bart", tmp_path_factory.mktemp("bart"))
    config = hf_model.config
    generator = torch.Generator().manual_seed(2)
    encoder_lens = [5, 40, 12, 3, 27, 18, 8, 33]
    encoders = [torch.randint(4, config.vocab_size, (n,), generator=generator).tolist() for n in encoder_lens]
    prompts, decoder_prompts = [], []
    for i, encoder in enumerate(encoders):
        if i % 2:
            prompts.append(TokensPrompt(prompt_token_ids=encoder))  # default decoder prompt [start, bos]
            decoder_prompts.append([config.decoder_start_token_id, config.bos_token_id])
        else:
            decoder = torch.randint(4, config.vocab_size, (i // 2 + 1,), generator=generator).tolist()
            prompts.append(ExplicitEncoderDecoderPrompt(encoder_prompt=TokensPrompt(prompt_token_ids=encoder),
                                                        decoder_prompt=TokensPrompt(prompt_token_ids=decoder)))
            decoder_prompts.append([config.decoder_start_token_id] + decoder)
    references = [hf_greedy(hf_model, torch.tensor(e), d, NUM_TOKENS) for e, d in zip(encoders, decoder_prompts)]
    return model_dir, prompts, encoders, decoder_prompts, references


@pytest.mark.parametrize("variant", list(ENGINE_VARIANTS))
def test_bart_parity(variant, cached, tmp_path_factory):
    model_dir, prompts, encoders, decoder_prompts, references = _cached(
        cached, "bart", lambda: _bart_case(tmp_path_factory))
    outputs, llm = _run_llm(model_dir, prompts, **ENGINE_VARIANTS[variant])
    _assert_matches(outputs, references)
    assert [o.encoder_prompt_token_ids for o in outputs] == encoders
    assert [o.prompt_token_ids for o in outputs] == decoder_prompts
    if variant != "roomy":
        assert llm.llm_engine.scheduler.num_cumulative_preemption > 0


def _whisper_case(tmp_path_factory):
    model_dir, hf_model = build_tiny_model("whisper", tmp_path_factory.mktemp("whisper"))
    config = hf_model.config
    generator = torch.Generator().manual_seed(3)
    features = [torch.randn(config.num_mel_bins, 2 * config.max_source_positions, generator=generator)
                for _ in range(8)]
    decoder_prompts = [[config.decoder_start_token_id] + torch.randint(4, 100, (i % 3,), generator=generator).tolist()
                       for i in range(8)]
    prompts = [TokensPrompt(prompt_token_ids=d, multi_modal_data={"input_features": f})
               for d, f in zip(decoder_prompts, features)]
    references = [hf_greedy(hf_model, f, d, NUM_TOKENS, features=True) for f, d in zip(features, decoder_prompts)]
    return model_dir, prompts, references


@pytest.mark.parametrize("variant", ["roomy", "swap"])
def test_whisper_parity(variant, cached, tmp_path_factory):
    model_dir, prompts, references = _cached(cached, "whisper", lambda: _whisper_case(tmp_path_factory))
    kwargs = dict(ENGINE_VARIANTS[variant])
    if variant == "swap":
        kwargs["num_gpu_blocks_override"] = 60
    outputs, llm = _run_llm(model_dir, prompts, **kwargs)
    _assert_matches(outputs, references)
    if variant != "roomy":
        assert llm.llm_engine.scheduler.num_cumulative_preemption > 0


@pytest.mark.parametrize("arch", ["llama", "bart"])
def test_bfloat16_runs_end_to_end_and_agrees_on_first_tokens(arch, tmp_path):
    model_dir, hf_model = build_tiny_model(arch, tmp_path)
    generator = torch.Generator().manual_seed(4)
    prompts = _decoder_only_prompts(hf_model.config.vocab_size, generator)
    llm = LLM(model_dir, skip_tokenizer_init=True, dtype="bfloat16", block_size=4, kv_cache_space_gb=0.05)
    assert llm.llm_engine.cache_engine.device_cache[0][0].dtype == torch.bfloat16
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    outputs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
    if arch == "bart":
        references = [hf_greedy(hf_model, torch.tensor(p), [2, 0], 8)[0] for p in prompts]
    else:
        references = [hf_greedy(hf_model, None, p, 8)[0] for p in prompts]
    # bfloat16 rounding lets later tokens drift from the float32 reference; the first ones must agree.
    first_agree = sum(o.outputs[0].token_ids[0] == r[0] for o, r in zip(outputs, references))
    assert first_agree >= 7
