"""The limits of every number in SamplingParams and BeamSearchParams (finite floats, integers within int64 and their
own ranges, each error naming its argument), and LLM.generate's type errors naming the argument at fault."""
import dataclasses

import pytest
from conftest import require_model

from seq2seq_engine.beam_search_params import BeamSearchParams
from seq2seq_engine.sampling_params import SamplingParams

INT64_MAX = 2 ** 63 - 1
NON_FINITE = [float("nan"), float("inf"), float("-inf"), 1e39, -1e39]  # 1e39 is inf once in float32


def _fields_of_type(cls, *types):
    return [field.name for field in dataclasses.fields(cls) if field.type in types]


SAMPLING_FLOATS = _fields_of_type(SamplingParams, "float")
SAMPLING_INTS = _fields_of_type(SamplingParams, "int", "Optional[int]")
BEAM_FLOATS = _fields_of_type(BeamSearchParams, "float")
BEAM_INTS = _fields_of_type(BeamSearchParams, "int")


def _beam(**kwargs):
    return BeamSearchParams(**{"beam_width": 2, "max_tokens": 8, **kwargs})


def test_the_field_walks_find_the_numbers():
    assert {"temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty",
            "repetition_penalty"} <= set(SAMPLING_FLOATS)
    assert {"n", "best_of", "top_k", "seed", "max_tokens", "min_tokens", "logprobs", "prompt_logprobs",
            "no_repeat_ngram_size", "forced_bos_token_id", "forced_eos_token_id"} <= set(SAMPLING_INTS)
    assert {"length_penalty", "temperature", "repetition_penalty"} <= set(BEAM_FLOATS)
    assert {"beam_width", "max_tokens", "min_tokens", "no_repeat_ngram_size"} <= set(BEAM_INTS)


@pytest.mark.parametrize("name", SAMPLING_FLOATS)
@pytest.mark.parametrize("value", NON_FINITE)
def test_every_sampling_float_must_be_finite(name, value):
    with pytest.raises(ValueError, match=rf"^{name} must be a finite number"):
        SamplingParams(**{name: value})


@pytest.mark.parametrize("name", BEAM_FLOATS)
@pytest.mark.parametrize("value", NON_FINITE)
def test_every_beam_search_float_must_be_finite(name, value):
    with pytest.raises(ValueError, match=rf"^{name} must be a finite number"):
        _beam(**{name: value})


def test_logit_bias_values_must_be_finite():
    for value in NON_FINITE:
        with pytest.raises(ValueError, match=r"^logit_bias values must be finite numbers"):
            SamplingParams(logit_bias={5: value})


@pytest.mark.parametrize("value", [11.0, -11.0, 1e30])
def test_length_penalty_is_bounded(value):
    # generated_len ** 1e300 overflows Python's floats inside the engine step
    with pytest.raises(ValueError, match=r"^length_penalty must be in \[-10.0, 10.0\]"):
        _beam(length_penalty=value)


@pytest.mark.parametrize("name", SAMPLING_INTS)
def test_every_sampling_int_is_within_int64(name):
    kwargs = {name: 2 ** 70}
    if name == "min_tokens":
        kwargs["max_tokens"] = None
    with pytest.raises(ValueError, match=rf"^{name} "):
        SamplingParams(**kwargs)


@pytest.mark.parametrize("name", BEAM_INTS)
def test_every_beam_search_int_is_within_int64(name):
    with pytest.raises(ValueError, match=rf"^{name} "):
        _beam(**{name: 2 ** 70})


def test_seed_fits_a_torch_generator():
    assert SamplingParams(seed=INT64_MAX).seed == INT64_MAX
    with pytest.raises(ValueError, match=r"^seed must be <= 2\*\*63-1, got 9223372036854775808"):
        SamplingParams(seed=INT64_MAX + 1)


@pytest.mark.parametrize("name", ["stop_token_ids", "suppress_tokens", "begin_suppress_tokens", "allowed_token_ids"])
def test_token_id_lists_are_within_int64(name):
    with pytest.raises(ValueError, match=rf"^{name} "):
        SamplingParams(**{name: [1, 2 ** 64]})


def test_token_ids_elsewhere_are_within_int64():
    with pytest.raises(ValueError, match=r"^bad_words_ids "):
        SamplingParams(bad_words_ids=[[2 ** 64]])
    with pytest.raises(ValueError, match=r"^logit_bias keys "):
        SamplingParams(logit_bias={2 ** 64: 1.0})


def test_negative_sizes_name_their_field():
    with pytest.raises(ValueError, match=r"^no_repeat_ngram_size must be >= 0"):
        SamplingParams(no_repeat_ngram_size=-1)
    with pytest.raises(ValueError, match=r"^no_repeat_ngram_size must be >= 0"):
        _beam(no_repeat_ngram_size=-1)


@pytest.fixture(scope="module")
def llm(one_thread):
    from seq2seq_engine import LLM
    return LLM(require_model("smollm2-135m"), max_model_len=128, max_num_seqs=4, kv_cache_space_gb=0.05,
               swap_space_gb=0.01)


@pytest.mark.parametrize("prompts, match", [
    (123, r"^prompts must be a str, a prompt dict or a list of them, got int"),
    (None, r"^prompts must be a str, a prompt dict or a list of them, got NoneType"),
    (b"Hi", r"^prompts must be a str, a prompt dict or a list of them, got bytes"),
    (["Hi", 5], r"^prompts\[1\] must be a str or a prompt dict, got int"),
])
def test_generate_names_the_prompts_argument(llm, prompts, match):
    with pytest.raises(TypeError, match=match):
        llm.generate(prompts, use_tqdm=False)
    with pytest.raises(TypeError, match=match):
        llm.beam_search(prompts, BeamSearchParams(beam_width=2, max_tokens=2), use_tqdm=False)
    assert not llm.llm_engine.has_unfinished_requests()


@pytest.mark.parametrize("overrides, error, match", [
    ({"max_tokens": "abc"}, TypeError, r"^max_tokens must be an int, got str"),
    ({"temperature": "hot"}, TypeError, r"^temperature must be a number, got str"),
    ({"beam_width": "two"}, TypeError, r"^beam_width must be an int, got str"),
    ({"seed": 2 ** 70, "max_tokens": 2}, ValueError, r"^seed must be <= 2\*\*63-1"),
    ({"temperature": float("nan")}, ValueError, r"^temperature must be a finite number"),
])
def test_generate_overrides_name_their_field(llm, overrides, error, match):
    with pytest.raises(error, match=match):
        llm.generate("Hi", overrides, use_tqdm=False)
    assert not llm.llm_engine.has_unfinished_requests()
    assert llm.generate("Hi", {"max_tokens": 2}, use_tqdm=False)[0].outputs[0].token_ids
