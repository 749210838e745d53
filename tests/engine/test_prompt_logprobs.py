"""prompt_logprobs, per-token logprobs and cumulative_logprob against HF transformers' log_softmax of the forward
logits (random tiny Llama and BART, float32): values within 1e-4, top-k sets equal, each prompt token scored once
whatever the chunking, preemption or n/best_of, and requests that do not ask left unchanged."""
import collections

import pytest
import torch
from hf_reference import build_tiny_model
from prompt_scoring_utils import hf_decoder_logits, random_tokens, small_llm

from seq2seq_engine import SamplingParams, TokensPrompt
from seq2seq_engine.inputs.data import ExplicitEncoderDecoderPrompt
from seq2seq_engine.worker import model_runner

TOL = 1e-4
CHUNKING = {False: {}, True: dict(enable_chunked_prefill=True, max_num_batched_tokens=16)}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return {arch: build_tiny_model(arch, tmp_path_factory.mktemp(arch)) for arch in ("llama", "bart")}


@pytest.fixture
def scored(monkeypatch):
    """The prompt-token spans [first, first + n) the runner scores, per request id, step by step."""
    spans = collections.defaultdict(list)
    original = model_runner.compute_prompt_logprobs

    def spy(plan, *args):
        for request_id, first, count in zip(plan.request_ids, plan.first_token_indices, plan.num_tokens):
            spans[request_id].append((first, count))
        return original(plan, *args)

    monkeypatch.setattr(model_runner, "compute_prompt_logprobs", spy)
    return spans


def _hf_logprobs(hf_model, decoder_tokens, encoder_tokens=None):
    """log_softmax of HF's logits over a whole decoder sequence: row p scores token p + 1."""
    return torch.log_softmax(hf_decoder_logits(hf_model, decoder_tokens, encoder_tokens), dim=-1)


def _assert_entry(entry, token_id, reference_row, k):
    """One {token_id: logprob} entry: the chosen token first, then HF's top k, values within TOL."""
    assert next(iter(entry)) == token_id
    assert set(entry) == {token_id, *reference_row.topk(k).indices.tolist()}
    for entry_token, logprob in entry.items():
        assert abs(logprob - float(reference_row[entry_token])) < TOL


def _assert_prompt_logprobs(prompt_logprobs, prompt, reference, k):
    assert len(prompt_logprobs) == len(prompt) and prompt_logprobs[0] is None
    for j in range(1, len(prompt)):
        _assert_entry(prompt_logprobs[j], prompt[j], reference[j - 1], k)


def _assert_scored_once(spans, prompt_len):
    """The scored spans tile prompt tokens 1 .. prompt_len - 1 exactly, in order."""
    expected_first = 1
    for first, count in spans:
        assert first == expected_first
        expected_first += count
    assert expected_first == max(prompt_len, 1)


@pytest.mark.parametrize("chunked", [False, True])
def test_decoder_only_prompt_logprobs_match_hf_and_leave_other_requests_unchanged(chunked, tiny, scored):
    model_dir, hf_model = tiny["llama"]
    lengths = [1, 5, 17, 40, 9, 26, 12]
    prompts = [random_tokens(n, seed) for seed, n in enumerate(lengths)]
    base = dict(temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=2)
    ks = [3, 0, 5, 1, None, None, 4]
    # The last request also has logits processors: prompt logprobs still come from the raw logits.
    extra = [{}] * 6 + [dict(repetition_penalty=1.5, logit_bias={7: 3.0})]
    params = [SamplingParams(prompt_logprobs=k, **base, **x) for k, x in zip(ks, extra)]
    # The second run must compute every prompt again to be compared bit for bit: no prefix cache.
    llm = small_llm(model_dir, enable_prefix_caching=False, **CHUNKING[chunked])
    outputs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
    plain = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts],
                         [SamplingParams(**base, **x) for x in extra], use_tqdm=False)
    for prompt, k, output, alone in zip(prompts, ks, outputs, plain):
        assert alone.prompt_logprobs is None
        assert output.outputs[0].token_ids == alone.outputs[0].token_ids
        assert output.outputs[0].logprobs == alone.outputs[0].logprobs
        if k is None:
            assert output.prompt_logprobs is None and output.request_id not in scored
            continue
        _assert_prompt_logprobs(output.prompt_logprobs, prompt, _hf_logprobs(hf_model, prompt), k)
        _assert_scored_once(scored[output.request_id], len(prompt))
    longest = outputs[lengths.index(40)].request_id
    # 16-token steps split the 40-token prompt into several chunks, each scoring its own positions.
    assert (len(scored[longest]) > 2) if chunked else (len(scored[longest]) == 1)


def test_bart_prompt_logprobs_cover_the_decoder_prompt(tiny, scored):
    model_dir, hf_model = tiny["bart"]
    start = hf_model.config.decoder_start_token_id
    encoders = [random_tokens(n, 100 + n) for n in (7, 30, 12, 3, 21, 16)]
    # Explicit decoder prompts of 0..4 tokens (the start token is prepended) and one default prompt [2, 0].
    prompts = [ExplicitEncoderDecoderPrompt(encoder_prompt=TokensPrompt(prompt_token_ids=e),
                                            decoder_prompt=TokensPrompt(prompt_token_ids=random_tokens(i, 200 + i)))
               for i, e in enumerate(encoders[:5])] + [TokensPrompt(prompt_token_ids=encoders[5])]
    ks = [2, 0, 3, 1, 5, 2]
    params = [SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True, prompt_logprobs=k) for k in ks]
    outputs = small_llm(model_dir).generate(prompts, params, use_tqdm=False)
    assert [len(o.prompt_token_ids) for o in outputs] == [1, 2, 3, 4, 5, 2]
    assert outputs[5].prompt_token_ids == [start, hf_model.config.bos_token_id]
    for encoder, k, output in zip(encoders, ks, outputs):
        decoder = output.prompt_token_ids
        assert decoder[0] == start
        _assert_prompt_logprobs(output.prompt_logprobs, decoder, _hf_logprobs(hf_model, decoder, encoder), k)
        _assert_scored_once(scored[output.request_id], len(decoder))


@pytest.mark.parametrize("chunked", [False, True])
def test_preemption_by_recompute_scores_each_prompt_token_once(chunked, tiny, scored):
    model_dir, hf_model = tiny["llama"]
    prompts = [random_tokens(n, 300 + n) for n in (3, 17, 5, 30, 9, 1, 24, 12)]
    llm = small_llm(model_dir, num_gpu_blocks_override=30, preemption_mode="recompute", **CHUNKING[chunked])
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, prompt_logprobs=2)
    outputs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
    assert llm.llm_engine.scheduler.num_cumulative_preemption > 0
    for prompt, output in zip(prompts, outputs):
        _assert_prompt_logprobs(output.prompt_logprobs, prompt, _hf_logprobs(hf_model, prompt), 2)
        _assert_scored_once(scored[output.request_id], len(prompt))
    assert not llm.llm_engine.model_runner.prompt_logprobs._num_scored  # released with the finished sequences


@pytest.mark.parametrize("arch", ["llama", "bart"])
def test_shared_prompt_of_best_of_is_scored_once(arch, tiny, scored):
    model_dir, hf_model = tiny[arch]
    prompt = random_tokens(19, 400)
    params = SamplingParams(n=2, best_of=3, temperature=1.0, seed=5, max_tokens=4, prompt_logprobs=1)
    output = small_llm(model_dir).generate(TokensPrompt(prompt_token_ids=prompt), params, use_tqdm=False)[0]
    assert len(output.outputs) == 2
    decoder = output.prompt_token_ids
    reference = _hf_logprobs(hf_model, decoder, prompt if arch == "bart" else None)
    _assert_prompt_logprobs(output.prompt_logprobs, decoder, reference, 1)
    _assert_scored_once(scored[output.request_id], len(decoder))


@pytest.mark.parametrize("arch", ["llama", "bart"])
def test_generated_logprobs_and_cumulative_logprob_match_hf(arch, tiny):
    model_dir, hf_model = tiny[arch]
    encoders = [random_tokens(n, 500 + n) for n in (4, 15, 9)]
    prompts = [TokensPrompt(prompt_token_ids=p) for p in encoders]
    params = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True, logprobs=4)
    for encoder, output in zip(encoders, small_llm(model_dir).generate(prompts, params, use_tqdm=False)):
        completion = output.outputs[0]
        decoder = output.prompt_token_ids + completion.token_ids
        reference = _hf_logprobs(hf_model, decoder, encoder if arch == "bart" else None)
        rows = reference[len(output.prompt_token_ids) - 1:-1]
        assert completion.token_ids == rows.argmax(dim=-1).tolist()
        assert len(completion.logprobs) == len(completion.token_ids) == 10
        for entry, token_id, row in zip(completion.logprobs, completion.token_ids, rows):
            _assert_entry(entry, token_id, row, 4)
        hf_sum = float(rows.gather(1, torch.tensor(completion.token_ids).unsqueeze(1)).sum())
        assert abs(completion.cumulative_logprob - hf_sum) < 10 * TOL
        assert output.prompt_logprobs is None
