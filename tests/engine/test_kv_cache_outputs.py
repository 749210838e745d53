"""The prefix and encoder caches change no output: every model family (BART, T5, Whisper, Llama) gives the same
tokens with the caches on and off for greedy, seeded sampling and beam search, also under recompute and swap
preemption in a pool too small for the batch; each distinct encoder input runs once; no block is leaked."""
import pytest
import torch
from hf_reference import random_tokens

from seq2seq_engine import LLM, BeamSearchParams, ExplicitEncoderDecoderPrompt, SamplingParams, TokensPrompt

BLOCK_SIZE = 4
CACHES_OFF = dict(enable_prefix_caching=False, enable_encoder_cache=False)


def _prompts(arch):
    """(prompts, number of distinct encoder inputs): each document under several decoder prompts (some repeated
    exactly), or for Llama one 13-token prefix (three full blocks) under different questions."""
    if arch == "llama":
        prefix = random_tokens(13, 100)
        return [TokensPrompt(prompt_token_ids=prefix + random_tokens(n, n)) for n in (1, 3, 6, 3, 9)], 0
    if arch == "whisper":
        features = [torch.randn(80, 100, generator=torch.Generator().manual_seed(seed)) for seed in (1, 2)]
        decoders = [[3], [3, 9], [3, 9, 17], [3]]
        return [TokensPrompt(prompt_token_ids=d, multi_modal_data={"input_features": f})
                for f in features for d in decoders], len(features)
    start = 0 if arch == "t5" else 2
    documents = [random_tokens(n, 10 + n) for n in (9, 20, 14)]
    decoders = [[start], [start, 5], [start, 7, 8, 11, 12, 13], [start, 5]]
    return [ExplicitEncoderDecoderPrompt(encoder_prompt=TokensPrompt(prompt_token_ids=doc),
                                         decoder_prompt=TokensPrompt(prompt_token_ids=dec))
            for doc in documents for dec in decoders], len(documents)


def _run(model_dir, prompts, mode, **engine_kwargs):
    llm = LLM(model_dir, skip_tokenizer_init=True, dtype="float32", block_size=BLOCK_SIZE, seed=0,
              kv_cache_space_gb=engine_kwargs.pop("kv_cache_space_gb", 0.02), **engine_kwargs)
    if mode == "beam":
        outputs = llm.beam_search(prompts, BeamSearchParams(beam_width=3, max_tokens=6, ignore_eos=True),
                                  use_tqdm=False)
    else:
        params = [SamplingParams(max_tokens=8, ignore_eos=True, logprobs=1,
                                 **(dict(temperature=0.0) if mode == "greedy" else dict(temperature=0.9, seed=i)))
                  for i in range(len(prompts))]
        outputs = llm.generate(prompts, params, use_tqdm=False)
    return llm.llm_engine, [[(c.token_ids, c.cumulative_logprob) for c in out.outputs] for out in outputs]


def _assert_same(cached, plain):
    for got, expected in zip(cached, plain):
        assert [tokens for tokens, _ in got] == [tokens for tokens, _ in expected]
        assert [lp for _, lp in got] == pytest.approx([lp for _, lp in expected], abs=1e-4)


def _assert_all_free(engine):
    manager, config = engine.scheduler.block_manager, engine.cache_config
    assert manager.get_num_free_gpu_blocks() == config.num_gpu_blocks
    assert manager.get_num_free_cpu_blocks() == config.num_cpu_blocks
    assert not manager.block_tables and not manager.cross_block_tables and not manager.cross_entries


@pytest.mark.parametrize("mode", ["greedy", "seeded", "beam"])
@pytest.mark.parametrize("arch", ["bart", "t5", "whisper", "llama"])
def test_outputs_equal_with_caches_on_and_off(family_models, arch, mode):
    prompts, num_documents = _prompts(arch)
    cached_engine, cached = _run(family_models[arch], prompts, mode)
    plain_engine, plain = _run(family_models[arch], prompts, mode, **CACHES_OFF)
    _assert_same(cached, plain)
    _assert_all_free(cached_engine)
    manager = cached_engine.scheduler.block_manager
    if num_documents:
        assert plain_engine.model_runner.num_encoder_runs == len(prompts)
        assert cached_engine.model_runner.num_encoder_runs == num_documents
        assert manager.cross_cache.num_hits == len(prompts) - num_documents
    else:
        # admitted in one step, the prompts cannot find each other's blocks computed yet: all are looked up
        assert manager.prefix_cache.num_queried_tokens == sum(len(p["prompt_token_ids"]) for p in prompts)


def test_second_batch_finds_the_prefix_and_the_encoder_outputs_cached(family_models):
    llm = LLM(family_models["llama"], skip_tokenizer_init=True, block_size=BLOCK_SIZE, kv_cache_space_gb=0.02)
    prompts, _ = _prompts("llama")
    params = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)
    first = llm.generate(prompts, params, use_tqdm=False)
    cache = llm.llm_engine.scheduler.block_manager.prefix_cache
    hits_before = cache.num_hit_tokens
    second = llm.generate(prompts, params, use_tqdm=False)
    # every prompt's three prefix blocks (12 tokens) are found; longer prompts find their own later blocks too
    assert cache.num_hit_tokens - hits_before >= 12 * len(prompts)
    assert [o.outputs[0].token_ids for o in first] == [o.outputs[0].token_ids for o in second]

    bart = LLM(family_models["bart"], skip_tokenizer_init=True, block_size=BLOCK_SIZE, kv_cache_space_gb=0.02)
    prompts, num_documents = _prompts("bart")
    bart.generate(prompts, params, use_tqdm=False)
    bart.generate(prompts, params, use_tqdm=False)
    assert bart.llm_engine.model_runner.num_encoder_runs == num_documents
    _assert_all_free(bart.llm_engine)


@pytest.mark.parametrize("preemption_mode", ["recompute", "swap"])
@pytest.mark.parametrize("arch", ["bart", "whisper", "llama"])
def test_preemption_with_caches_keeps_outputs(family_models, arch, preemption_mode):
    prompts, _ = _prompts(arch)
    prompts = prompts * 2
    mode = "greedy" if preemption_mode == "recompute" else "beam"  # beams are swapped, single sequences recomputed
    _, plain = _run(family_models[arch], prompts, mode, **CACHES_OFF)
    num_blocks = {"bart": 30, "whisper": 40, "llama": 24}[arch]
    tight_engine, tight = _run(family_models[arch], prompts, mode, num_gpu_blocks_override=num_blocks,
                               swap_space_gb=0.01, preemption_mode=preemption_mode)
    assert tight_engine.scheduler.num_cumulative_preemption > 0
    _assert_same(tight, plain)
    _assert_all_free(tight_engine)


def test_reset_prefix_cache_makes_the_next_batch_compute_everything_again(family_models):
    params = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)
    bart = LLM(family_models["bart"], skip_tokenizer_init=True, block_size=BLOCK_SIZE, kv_cache_space_gb=0.02)
    prompts, num_documents = _prompts("bart")
    first = bart.generate(prompts, params, use_tqdm=False)
    runner, manager = bart.llm_engine.model_runner, bart.llm_engine.scheduler.block_manager
    assert manager.gpu_allocator.get_num_evictable_blocks() > 0
    assert bart.reset_prefix_cache()
    assert manager.gpu_allocator.get_num_evictable_blocks() == 0 and not manager.cross_cache.entries
    again = bart.generate(prompts, params, use_tqdm=False)
    assert runner.num_encoder_runs == 2 * num_documents  # nothing found cached
    assert [o.outputs[0].token_ids for o in first] == [o.outputs[0].token_ids for o in again]
    _assert_all_free(bart.llm_engine)
    bart.llm_engine.add_request("running", prompts[0], params)
    assert not bart.reset_prefix_cache()  # refused while a request is unfinished
    bart.llm_engine.abort_request("running")

    llm = LLM(family_models["llama"], skip_tokenizer_init=True, block_size=BLOCK_SIZE, kv_cache_space_gb=0.02)
    prompts, _ = _prompts("llama")
    llm.generate(prompts, params, use_tqdm=False)
    cache = llm.llm_engine.scheduler.block_manager.prefix_cache
    assert cache.blocks and llm.reset_prefix_cache() and not cache.blocks
    hits = cache.num_hit_tokens
    llm.generate(prompts, params, use_tqdm=False)
    assert cache.num_hit_tokens == hits  # the same prompts: their blocks were forgotten


def test_a_cpu_engine_caps_the_free_blocks_its_caches_keep(family_models):
    from seq2seq_engine.engine.llm_engine import CPU_CACHED_KV_BYTES
    from seq2seq_engine.worker.cache_engine import cache_block_bytes
    engine = LLM(family_models["bart"], skip_tokenizer_init=True, block_size=BLOCK_SIZE,
                 kv_cache_space_gb=0.01).llm_engine
    block_bytes = cache_block_bytes(*engine.model_runner.model.kv_cache_spec(), BLOCK_SIZE, engine.kv_cache_dtype)
    assert engine.cache_config.max_cached_blocks == CPU_CACHED_KV_BYTES // block_bytes > 0
    assert engine.scheduler.block_manager.gpu_allocator.max_evictable == engine.cache_config.max_cached_blocks
