"""LLMEngine.step(finished_only=True) returns exactly the finished outputs of step(), in the same steps."""
import random

import pytest
from hf_reference import build_tiny_model

from seq2seq_engine import LLM, SamplingParams, TokensPrompt
from seq2seq_engine.inputs.data import ExplicitEncoderDecoderPrompt


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    model_dir, _ = build_tiny_model("bart", tmp_path_factory.mktemp("bart_finished_only"))
    return LLM(model_dir, kv_cache_space_gb=0.05, block_size=8, skip_tokenizer_init=True).llm_engine


def _run(engine, finished_only):
    """Per step, the (request id, finished, tokens, finish reason, ignored reason) of every output it returned."""
    rng = random.Random(7)
    for index, max_tokens in enumerate([3, 9, 5, 1, 9, 7]):
        encoder = [rng.randrange(4, 200) for _ in range(rng.randrange(3, 20))]
        prompt = ExplicitEncoderDecoderPrompt(encoder_prompt=TokensPrompt(prompt_token_ids=encoder),
                                              decoder_prompt=TokensPrompt(prompt_token_ids=[2, 0]))
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        engine.add_request(f"r{index}", prompt, params)
    steps = []
    while engine.has_unfinished_requests():
        outputs = engine.step(finished_only=True) if finished_only else engine.step()
        steps.append([(o.request_id, o.finished, o.outputs[0].token_ids, o.outputs[0].finish_reason,
                       o.ignored_reason) for o in outputs])
    return steps


def test_finished_only_outputs_are_the_finished_outputs_of_a_full_step(engine):
    every = _run(engine, finished_only=False)
    finished = _run(engine, finished_only=True)
    assert any(not done for step in every for _, done, *_ in step)  # step() also returns running requests
    assert finished == [[output for output in step if output[1]] for step in every]
    returned = [output[0] for step in finished for output in step]
    assert sorted(returned) == [f"r{i}" for i in range(6)]
