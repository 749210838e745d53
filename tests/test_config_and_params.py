"""Validation of the engine configs (config.py) and SamplingParams: each bad field raises, naming the field."""
import types

import pytest

from seq2seq_engine.config import (CacheConfig, DeviceConfig, EngineConfig, ModelConfig, SchedulerConfig,
                                   model_config_from_hf)
from seq2seq_engine.sampling_params import SamplingParams, SamplingType


def _bart(**overrides):
    kwargs = dict(model="bart", vocab_size=50265, max_target_positions=1024, is_encoder_decoder=True,
                  max_source_positions=1024, decoder_start_token_id=2)
    kwargs.update(overrides)
    return ModelConfig(**kwargs)


# ----------------------------------------------------------------------------- config.py
def test_valid_defaults_construct():
    model = _bart()
    assert (model.max_model_len, model.max_encoder_len, model.dtype) == (1024, 1024, "float32")
    decoder_only = ModelConfig(model="llama", vocab_size=100, max_target_positions=64, is_encoder_decoder=False)
    assert decoder_only.max_encoder_len == 0 and decoder_only.max_model_len == 64
    cache, scheduler, device = CacheConfig(), SchedulerConfig(), DeviceConfig()
    assert (cache.block_size, cache.num_gpu_blocks, cache.watermark) == (16, None, 0.01)
    assert (scheduler.policy, scheduler.preemption_mode, scheduler.enable_chunked_prefill) == ("fcfs", "recompute",
                                                                                               False)
    assert device.resolved == "cpu" or device.resolved == "cuda"
    engine = EngineConfig(model, cache, scheduler)
    assert engine.device_config == DeviceConfig()


@pytest.mark.parametrize("overrides, match", [
    (dict(vocab_size=0), r"^vocab_size must be a positive integer"),
    (dict(vocab_size=True), r"^vocab_size must be a positive integer"),
    (dict(vocab_size=3.0), r"^vocab_size must be a positive integer"),
    (dict(max_target_positions=-1), r"^max_target_positions must be a positive integer"),
    (dict(dtype="float64"), r"^dtype must be one of"),
    (dict(max_source_positions=0), r"^max_source_positions must be a positive integer"),
    (dict(decoder_start_token_id=None), r"^decoder_start_token_id is required"),
    (dict(is_encoder_decoder=False), r"^max_source_positions is only meaningful"),
])
def test_model_config_rejects(overrides, match):
    with pytest.raises(ValueError, match=match):
        _bart(**overrides)


@pytest.mark.parametrize("kwargs, match", [
    (dict(block_size=0), r"^block_size must be a positive integer"),
    (dict(kv_cache_space_gb=0), r"^kv_cache_space_gb must be > 0"),
    (dict(swap_space_gb=-0.5), r"^swap_space_gb must be >= 0"),
    (dict(num_gpu_blocks=0), r"^num_gpu_blocks must be a positive integer"),
    (dict(num_cpu_blocks=-1), r"^num_cpu_blocks must be a non-negative integer"),
    (dict(num_cpu_blocks=2.5), r"^num_cpu_blocks must be a non-negative integer"),
    (dict(watermark=1.0), r"^watermark must be in \[0, 1\)"),
    (dict(watermark=-0.1), r"^watermark must be in \[0, 1\)"),
])
def test_cache_config_rejects(kwargs, match):
    with pytest.raises(ValueError, match=match):
        CacheConfig(**kwargs)


def test_cache_config_accepts_explicit_blocks_and_empty_swap_pool():
    cache = CacheConfig(block_size=4, num_gpu_blocks=16, num_cpu_blocks=0, watermark=0.0)
    assert (cache.num_gpu_blocks, cache.num_cpu_blocks) == (16, 0)


@pytest.mark.parametrize("kwargs, match", [
    (dict(max_num_batched_tokens=0), r"^max_num_batched_tokens must be a positive integer"),
    (dict(max_num_seqs=-3), r"^max_num_seqs must be a positive integer"),
    (dict(max_model_len=0), r"^max_model_len must be a positive integer"),
    (dict(policy="lifo"), r"^policy must be one of"),
    (dict(preemption_mode="evict"), r"^preemption_mode must be one of"),
    (dict(max_num_batched_tokens=100, max_model_len=200),
     r"^max_num_batched_tokens \(100\) is smaller than the longest prompt the model accepts \(200\)"),
    (dict(max_num_batched_tokens=100, max_model_len=50, max_encoder_len=300),
     r"^max_num_batched_tokens \(100\) is smaller than the longest prompt the model accepts \(300\)"),
])
def test_scheduler_config_rejects(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SchedulerConfig(**kwargs)


def test_chunked_prefill_lifts_the_batched_tokens_floor():
    config = SchedulerConfig(max_num_batched_tokens=100, max_model_len=200, enable_chunked_prefill=True)
    assert config.max_num_batched_tokens == 100


def test_device_config():
    with pytest.raises(ValueError, match=r"^device must be 'auto', 'cpu' or 'cuda'"):
        DeviceConfig("tpu")
    assert DeviceConfig("cpu").resolved == "cpu" and DeviceConfig("cuda").resolved == "cuda"


def test_configs_are_frozen():
    with pytest.raises(AttributeError):
        CacheConfig().block_size = 8


def test_model_config_from_hf_bart_like_and_decoder_only():
    bart = types.SimpleNamespace(is_encoder_decoder=True, max_position_embeddings=1024, vocab_size=50265,
                                 decoder_start_token_id=2, bos_token_id=0, eos_token_id=[2, 3], pad_token_id=1)
    config = model_config_from_hf("bart", bart, max_model_len=142)
    assert (config.max_model_len, config.max_encoder_len, config.eos_token_id) == (142, 1024, 2)
    assert config.is_encoder_decoder and config.decoder_start_token_id == 2 and config.hf_config is bart
    with pytest.raises(ValueError, match=r"^max_model_len=2048 exceeds the model's 1024 positions"):
        model_config_from_hf("bart", bart, max_model_len=2048)
    llama = types.SimpleNamespace(max_position_embeddings=64, vocab_size=100, decoder_start_token_id=5)
    decoder_only = model_config_from_hf("llama", llama)
    assert not decoder_only.is_encoder_decoder and decoder_only.decoder_start_token_id is None
    assert decoder_only.max_source_positions is None
    with pytest.raises(ValueError, match=r"cannot tell the maximum sequence length of SimpleNamespace"):
        model_config_from_hf("x", types.SimpleNamespace(vocab_size=10))


# ----------------------------------------------------------------------------- sampling_params.py
def test_sampling_defaults():
    params = SamplingParams()
    assert (params.n, params.best_of, params.max_tokens, params.stop, params.stop_token_ids) == (1, 1, 16, [], [])
    assert params.sampling_type == SamplingType.RANDOM


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(n=0), ValueError, r"^n must be >= 1"),
    (dict(n=True), TypeError, r"^n must be an int"),
    (dict(n=2.0), TypeError, r"^n must be an int"),
    (dict(n=3, best_of=2), ValueError, r"^best_of must be >= 3"),
    (dict(temperature=-0.1), ValueError, r"^temperature must be in \[0.0, inf\]"),
    (dict(temperature="hot"), TypeError, r"^temperature must be a number"),
    (dict(top_p=0.0), ValueError, r"^top_p must be in \(0.0, 1.0\]"),
    (dict(top_p=1.5), ValueError, r"^top_p must be in \(0.0, 1.0\]"),
    (dict(top_k=0), ValueError, r"^top_k must be -1 \(disabled\) or at least 1"),
    (dict(top_k=-2), ValueError, r"^top_k must be >= -1"),
    (dict(min_p=1.5), ValueError, r"^min_p must be in \[0.0, 1.0\]"),
    (dict(seed=-1), ValueError, r"^seed must be >= 0"),
    (dict(seed="0"), TypeError, r"^seed must be an int"),
    (dict(presence_penalty=2.5), ValueError, r"^presence_penalty must be in \[-2.0, 2.0\]"),
    (dict(frequency_penalty=-3), ValueError, r"^frequency_penalty must be in \[-2.0, 2.0\]"),
    (dict(repetition_penalty=0.0), ValueError, r"^repetition_penalty must be in \[1e-06, inf\]"),
    (dict(repetition_penalty=1e-300), ValueError, r"^repetition_penalty must be in \[1e-06, inf\]"),
    (dict(max_tokens=0), ValueError, r"^max_tokens must be >= 1"),
    (dict(min_tokens=-1), ValueError, r"^min_tokens must be >= 0"),
    (dict(min_tokens=5, max_tokens=4), ValueError, r"^min_tokens \(5\) must be <= max_tokens \(4\)"),
    (dict(logprobs=-1), ValueError, r"^logprobs must be >= 0"),
    (dict(prompt_logprobs=1.0), TypeError, r"^prompt_logprobs must be an int"),
    (dict(stop=""), ValueError, r"^stop must hold non-empty strings"),
    (dict(stop=["ok", 3]), ValueError, r"^stop must hold non-empty strings"),
    (dict(stop_token_ids=[1, -2]), ValueError, r"^stop_token_ids must hold non-negative ints"),
    (dict(stop_token_ids=[True]), ValueError, r"^stop_token_ids must hold non-negative ints"),
    (dict(temperature=0.0, n=1, best_of=2), ValueError, r"^best_of must be 1 for greedy sampling"),
    (dict(repetition_penalty=-1.0), ValueError, r"^repetition_penalty must be in \[1e-06, inf\]"),
    (dict(no_repeat_ngram_size=-1), ValueError, r"^no_repeat_ngram_size must be >= 0"),
    (dict(no_repeat_ngram_size=2.0), TypeError, r"^no_repeat_ngram_size must be an int"),
    (dict(bad_words="damn"), ValueError, r"^bad_words must be a list of non-blank strings"),
    (dict(bad_words=["ok", " "]), ValueError, r"^bad_words must be a list of non-blank strings"),
    (dict(bad_words_ids=[5, 6]), ValueError, r"^bad_words_ids must be a list of non-empty lists of token ids"),
    (dict(bad_words_ids=[[5], []]), ValueError, r"^bad_words_ids must be a list of non-empty lists of token ids"),
    (dict(bad_words_ids=[[5, -1]]), ValueError, r"^bad_words_ids must be a list of non-negative int token ids"),
    (dict(forced_bos_token_id=-3), ValueError, r"^forced_bos_token_id must be a non-negative int token id or None"),
    (dict(forced_eos_token_id="2"), ValueError, r"^forced_eos_token_id must be a non-negative int token id or None"),
    (dict(suppress_tokens=[1, 2.5]), ValueError, r"^suppress_tokens must be a list of non-negative int token ids"),
    (dict(begin_suppress_tokens=7), ValueError, r"^begin_suppress_tokens must be a list of non-negative int"),
    (dict(logit_bias=[(1, 2.0)]), TypeError, r"^logit_bias must be a dict"),
    (dict(logit_bias={"5": 1.0}), ValueError, r"^logit_bias keys must be non-negative int token ids"),
    (dict(logit_bias={5: float("inf")}), ValueError, r"^logit_bias values must be finite numbers"),
    (dict(allowed_token_ids=[]), ValueError, r"^allowed_token_ids must not be empty"),
    (dict(allowed_token_ids=[3, -1]), ValueError, r"^allowed_token_ids must be a list of non-negative int token ids"),
    (dict(allowed_token_ids=[3, 4], forced_eos_token_id=2), ValueError,
     r"^forced_eos_token_id=2 is not in allowed_token_ids"),
])
def test_sampling_params_rejects(kwargs, error, match):
    with pytest.raises(error, match=match):
        SamplingParams(**kwargs)


def test_processor_fields_are_copied_and_normalised():
    suppress, bias = (4, 5), {3: 1}
    params = SamplingParams(suppress_tokens=suppress, bad_words_ids=[(1, 2)], logit_bias=bias)
    assert params.suppress_tokens == [4, 5] and params.bad_words_ids == [[1, 2]]
    bias[9] = 2.0
    assert params.logit_bias == {3: 1} and params.all_bad_words_ids == [[1, 2]]
    assert SamplingParams().all_bad_words_ids == []


def test_sampling_type():
    assert SamplingParams(temperature=0.0).sampling_type == SamplingType.GREEDY
    assert SamplingParams(temperature=1e-6).sampling_type == SamplingType.GREEDY
    assert SamplingParams(temperature=0.7).sampling_type == SamplingType.RANDOM
    assert SamplingParams(temperature=0.7, seed=3).sampling_type == SamplingType.RANDOM_SEED
    assert SamplingParams(temperature=0.0, seed=3).sampling_type == SamplingType.GREEDY


def test_best_of_defaults_to_n_and_may_exceed_it():
    assert SamplingParams(n=4).best_of == 4
    assert SamplingParams(n=2, best_of=5).best_of == 5


def test_stop_is_normalised_to_a_list():
    assert SamplingParams(stop="###").stop == ["###"]
    assert SamplingParams(stop=("a", "b")).stop == ["a", "b"]
    assert SamplingParams(stop=None).stop == []
    assert SamplingParams(stop_token_ids=(7, 8)).stop_token_ids == [7, 8]


def test_unbounded_max_tokens_and_clone_is_independent():
    assert SamplingParams(max_tokens=None, min_tokens=100).max_tokens is None
    params = SamplingParams(stop=["x"], n=2)
    clone = params.clone()
    assert clone == params and clone.stop is not params.stop
    clone.stop.append("y")
    assert params.stop == ["x"]


def test_encoder_decoder_model_config_needs_max_source_positions():
    with pytest.raises(ValueError, match="max_source_positions"):
        ModelConfig(model="m", vocab_size=10, max_target_positions=8, is_encoder_decoder=True,
                    decoder_start_token_id=2)
