"""The cache counters of /metrics read from a real engine (a tiny random BART): each read adds what the engine's
cumulative counts grew since the last one, and a cache switched off leaves its counters at 0."""
import re

import pytest
from hf_reference import build_tiny_model

from seq2seq_engine import LLM, ExplicitEncoderDecoderPrompt, SamplingParams, TokensPrompt
from seq2seq_engine.entrypoints.openai.metrics import ServerMetrics

NAMES = ("prefix_cache_queries", "prefix_cache_hits", "encoder_cache_queries", "encoder_cache_hits", "encoder_runs")
BLOCK_SIZE = 4
# An encoder input and a decoder prompt of three full blocks and one token more.
PROMPT = ExplicitEncoderDecoderPrompt(encoder_prompt=TokensPrompt(prompt_token_ids=list(range(5, 25))),
                                      decoder_prompt=TokensPrompt(prompt_token_ids=[2] + list(range(30, 42))))
GREEDY = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)


@pytest.fixture(scope="module")
def bart_dir(tmp_path_factory):
    return build_tiny_model("bart", tmp_path_factory.mktemp("bart"))[0]


def _counters(metrics):
    text = metrics.render().decode()
    return {name: float(re.search(rf"^seq2seq_engine:{name}_total\{{[^}}]*\}} (\S+)$", text, re.M).group(1))
            for name in NAMES}


def _served_twice(model_dir, **cache_switches):
    """The counters after each of two identical requests, each read twice (a second read adds nothing)."""
    llm = LLM(model_dir, skip_tokenizer_init=True, kv_cache_space_gb=0.01, block_size=BLOCK_SIZE, **cache_switches)
    metrics = ServerMetrics("bart")
    reads = []
    for _ in range(2):
        llm.generate([PROMPT], GREEDY, use_tqdm=False)
        metrics.engine_state(llm.llm_engine)
        metrics.engine_state(llm.llm_engine)
        reads.append(_counters(metrics))
    return reads


def test_cache_counters_grow_by_the_engines_counts(bart_dir):
    first, second = _served_twice(bart_dir)
    num_tokens = 13
    assert first == {"prefix_cache_queries": num_tokens, "prefix_cache_hits": 0, "encoder_cache_queries": 1,
                     "encoder_cache_hits": 0, "encoder_runs": 1}
    # The second request finds its cross table and the three full blocks before its last prompt token.
    assert second == {"prefix_cache_queries": 2 * num_tokens, "prefix_cache_hits": 3 * BLOCK_SIZE,
                      "encoder_cache_queries": 2, "encoder_cache_hits": 1, "encoder_runs": 1}


def test_switched_off_caches_leave_their_counters_at_zero(bart_dir):
    first, second = _served_twice(bart_dir, enable_prefix_caching=False, enable_encoder_cache=False)
    zero = {"prefix_cache_queries": 0, "prefix_cache_hits": 0, "encoder_cache_queries": 0, "encoder_cache_hits": 0}
    assert first == {**zero, "encoder_runs": 1}
    assert second == {**zero, "encoder_runs": 2}
