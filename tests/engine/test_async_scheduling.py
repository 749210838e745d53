"""Asynchronous scheduling changes no output: every family (BART, T5, Whisper, Llama) gives the same tokens and
log-probs with it on and off for greedy and seeded sampling with EOS and mixed length caps, beam search, n > 1, stop
tokens and stop strings (with their text), preemption by recompute and by swap in a pool too small for the batch;
steps really run ahead; an abort between steps reports real tokens only and leaves the others' outputs and the pool's
blocks as without it."""
import pytest
import torch
from hf_reference import random_tokens

from seq2seq_engine import LLM, BeamSearchParams, ExplicitEncoderDecoderPrompt, SamplingParams, TokensPrompt
from seq2seq_engine.sequence_data import PLACEHOLDER_TOKEN_ID

ARCHS = ("bart", "t5", "whisper", "llama")


def _prompts(arch, count=6):
    if arch == "llama":
        return [TokensPrompt(prompt_token_ids=random_tokens(3 + 2 * i, i)) for i in range(count)]
    if arch == "whisper":
        return [TokensPrompt(prompt_token_ids=[3], multi_modal_data={
            "input_features": torch.randn(80, 100, generator=torch.Generator().manual_seed(i))}) for i in range(count)]
    start = 0 if arch == "t5" else 2
    return [ExplicitEncoderDecoderPrompt(encoder_prompt=TokensPrompt(prompt_token_ids=random_tokens(5 + 3 * i, 10 + i)),
                                         decoder_prompt=TokensPrompt(prompt_token_ids=[start]))
            for i in range(count)]


def _llm(model_dir, async_scheduling, **kwargs):
    return LLM(model_dir, skip_tokenizer_init=True, dtype="float32", block_size=4, seed=0,
               kv_cache_space_gb=kwargs.pop("kv_cache_space_gb", 0.02), async_scheduling=async_scheduling, **kwargs)


def _params(mode, count):
    """Per request: lengths capped at different steps, EOS left on (some stop early), logprobs asked."""
    base = [dict(max_tokens=4 + 3 * i, logprobs=2) for i in range(count)]
    if mode == "greedy":
        return [SamplingParams(temperature=0.0, **b) for b in base]
    if mode == "seeded":
        return [SamplingParams(temperature=1.0, seed=7 + i, **b) for i, b in enumerate(base)]
    if mode == "n2":
        return [SamplingParams(temperature=1.0, seed=i, n=2, **b) for i, b in enumerate(base)]
    if mode == "stop_tokens":   # each request stops at a token it is likely to sample
        return [SamplingParams(temperature=1.0, seed=i, stop_token_ids=list(range(4 + 40 * i, 44 + 40 * i)),
                               **b) for i, b in enumerate(base)]
    if mode == "penalties":     # reads earlier tokens: never run ahead, still exact
        return [SamplingParams(temperature=0.0, repetition_penalty=1.3, **b) for b in base]
    raise ValueError(mode)


def _outputs(llm, prompts, mode):
    if mode == "beam":
        outputs = llm.beam_search(prompts, BeamSearchParams(beam_width=3, max_tokens=6), use_tqdm=False)
    else:
        outputs = llm.generate(prompts, _params(mode, len(prompts)), use_tqdm=False)
    return [[(list(c.token_ids), c.cumulative_logprob, c.logprobs, c.finish_reason, c.stop_reason)
             for c in out.outputs] for out in outputs]


def _assert_no_leak(engine):
    manager, config = engine.scheduler.block_manager, engine.cache_config
    assert not engine.has_unfinished_requests()
    assert manager.get_num_free_gpu_blocks() == config.num_gpu_blocks
    assert manager.get_num_free_cpu_blocks() == config.num_cpu_blocks
    assert not manager.block_tables and not manager.cross_block_tables


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("mode", ["greedy", "seeded", "n2", "stop_tokens", "penalties", "beam"])
def test_same_outputs_with_and_without(family_models, arch, mode):
    prompts = _prompts(arch)
    expected = _outputs(_llm(family_models[arch], False), prompts, mode)
    llm = _llm(family_models[arch], True)
    assert _outputs(llm, prompts, mode) == expected
    engine = llm.llm_engine
    if mode in ("greedy", "seeded", "stop_tokens"):
        assert engine.async_scheduler.steps_ahead > 0
    elif mode in ("penalties", "beam", "n2"):
        assert engine.async_scheduler.steps_ahead == 0   # these requests never run ahead
    _assert_no_leak(engine)


@pytest.mark.parametrize("arch", ["bart", "llama"])
@pytest.mark.parametrize("preemption_mode", ["recompute", "swap"])
def test_same_outputs_under_preemption(family_models, arch, preemption_mode):
    """A pool too small for the batch: requests are preempted and resumed (those steps run synchronously)."""
    prompts = _prompts(arch, count=8)
    params = [SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True) for _ in prompts]
    kwargs = dict(num_gpu_blocks_override=40, swap_space_gb=0.01, preemption_mode=preemption_mode)
    runs = {}
    for flag in (False, True):
        llm = _llm(family_models[arch], flag, **kwargs)
        runs[flag] = [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params, use_tqdm=False)]
        assert llm.llm_engine.scheduler.num_cumulative_preemption > 0
    assert runs[True] == runs[False]
    assert llm.llm_engine.async_scheduler.steps_ahead > 0
    _assert_no_leak(llm.llm_engine)


def _stream(engine, prompts, params, abort_at=None):
    """Every output each step returns, by request; `abort_at`: (step, request id) aborted after that step."""
    for i, (prompt, p) in enumerate(zip(prompts, params)):
        engine.add_request(str(i), prompt, p)
    seen, step = {}, 0
    while engine.has_unfinished_requests():
        for output in engine.step():
            seen.setdefault(output.request_id, []).append(output)
        step += 1
        if abort_at is not None and step == abort_at[0]:
            aborted = next(g for g in engine.scheduler.running if g.request_id == abort_at[1]).first_seq
            assert PLACEHOLDER_TOKEN_ID in aborted.data.output_token_ids     # its token was still pending
            engine.abort_request(abort_at[1])
            # what a caller may still read of the aborted request holds real tokens only
            assert PLACEHOLDER_TOKEN_ID not in aborted.data.output_token_ids
            assert aborted.is_finished()
    return seen


@pytest.mark.parametrize("arch", ["whisper", "llama"])
def test_streamed_outputs_and_an_abort(family_models, arch):
    """Each step's outputs hold real tokens that grow as without asynchronous scheduling (one step later); an abort
    between steps leaves the other requests' outputs unchanged and frees every block."""
    prompts = _prompts(arch, count=4)
    params = [SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True) for _ in prompts]
    plain = _stream(_llm(family_models[arch], False).llm_engine, prompts, params)
    assert PLACEHOLDER_TOKEN_ID not in sum((list(o[-1].outputs[0].token_ids) for o in plain.values()), [])
    llm = _llm(family_models[arch], True)
    streamed = _stream(llm.llm_engine, prompts, params, abort_at=(5, "2"))
    for request_id, outputs in streamed.items():
        final = plain[request_id][-1].outputs[0].token_ids
        for output in outputs:
            tokens = list(output.outputs[0].token_ids)
            assert PLACEHOLDER_TOKEN_ID not in tokens
            assert tokens == list(final[:len(tokens)])
        if request_id != "2":
            assert outputs[-1].finished and list(outputs[-1].outputs[0].token_ids) == list(final)
    assert not streamed["2"][-1].finished    # aborted after its fifth step: never reported finished
    assert llm.llm_engine.async_scheduler.steps_ahead > 0
    _assert_no_leak(llm.llm_engine)


def test_stop_strings_and_detokenized_text_as_without(bart_with_tokenizer):
    """Stop strings taken from the middle of each request's free-running text: it stops there, text cut the same,
    whether the step after the stop had already been launched or not."""
    model_dir = bart_with_tokenizer[0]
    prompts = ["the quick brown fox", "a b c d e f", "hello world again", "numbers one two three"]

    def run(flag, stops):
        llm = LLM(model_dir, kv_cache_space_gb=0.02, block_size=4, seed=0, async_scheduling=flag)
        params = [SamplingParams(temperature=1.0, seed=i, max_tokens=16, stop=stop, include_stop_str_in_output=i % 2)
                  for i, stop in enumerate(stops)]
        outputs = llm.generate(prompts, params, use_tqdm=False)
        return llm, [(o.outputs[0].text, list(o.outputs[0].token_ids), o.outputs[0].finish_reason,
                      o.outputs[0].stop_reason) for o in outputs]

    _, free = run(False, [[] for _ in prompts])
    stops = [[text[len(text) // 2:len(text) // 2 + 3]] if len(text) > 6 else [] for text, *_ in free]
    assert sum(bool(s) for s in stops) >= 3
    _, expected = run(False, stops)
    assert sum(reason == "stop" for _, _, reason, _ in expected) >= 3
    llm, got = run(True, stops)
    assert got == expected
    assert llm.llm_engine.async_scheduler.steps_ahead > 0
    _assert_no_leak(llm.llm_engine)
