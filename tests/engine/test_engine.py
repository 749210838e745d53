"""LLMEngine / LLM behaviour on a tiny random BART with a real (sentencepiece) tokenizer: text in and out,
stop conditions, seeds, aborts returning every block, and clear errors for bad requests."""
import pytest
import torch
import transformers
from hf_reference import build_tiny_model, hf_greedy

from seq2seq_engine import LLM, SamplingParams, TokensPrompt


@pytest.fixture(scope="module")
def bart_with_tokenizer(tmp_path_factory, spm_bart_tokenizer):
    model_dir, hf_model = build_tiny_model("bart", tmp_path_factory.mktemp("bart_tok"),
                                           vocab_size=len(spm_bart_tokenizer))
    spm_bart_tokenizer.save_pretrained(model_dir)
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    assert len(tokenizer) == hf_model.config.vocab_size
    return model_dir, hf_model, tokenizer


@pytest.fixture(scope="module")
def llm(bart_with_tokenizer):
    return LLM(bart_with_tokenizer[0], kv_cache_space_gb=0.05, block_size=8)


def _free_blocks(llm):
    manager = llm.llm_engine.scheduler.block_manager
    return manager.get_num_free_gpu_blocks(), manager.get_num_free_cpu_blocks()


def _all_free(llm):
    config = llm.llm_engine.cache_config
    return _free_blocks(llm) == (config.num_gpu_blocks, config.num_cpu_blocks)


def test_text_prompts_generate_hf_tokens_and_decoded_text(llm, bart_with_tokenizer):
    _, hf_model, tokenizer = bart_with_tokenizer
    texts = ["the quick brown fox", "a lazy dog sleeps in the sun and the moon"]
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    outputs = llm.generate(texts, params, use_tqdm=False)
    for text, output in zip(texts, outputs):
        encoder_ids = tokenizer(text).input_ids
        assert output.encoder_prompt == text and output.encoder_prompt_token_ids == encoder_ids
        expected, _ = hf_greedy(hf_model, torch.tensor(encoder_ids), [2, 0], 12)
        completion = output.outputs[0]
        assert completion.token_ids == expected
        assert completion.text == tokenizer.decode(expected, skip_special_tokens=True)
    assert _all_free(llm)


def test_stop_token_and_stop_string_end_generation(llm):
    free_run = llm.generate("the quick brown fox", SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True),
                            use_tqdm=False)[0].outputs[0]
    stop_token = free_run.token_ids[3]
    stopped = llm.generate("the quick brown fox", SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True,
                                                                 stop_token_ids=[stop_token]),
                           use_tqdm=False)[0].outputs[0]
    first = free_run.token_ids.index(stop_token)
    assert stopped.token_ids == free_run.token_ids[:first + 1]
    assert stopped.finish_reason == "stop" and stopped.stop_reason == stop_token
    stop_text = free_run.text[len(free_run.text) // 2:][:3]
    assert stop_text.strip(), f"generated text too short to test stop strings: {free_run.text!r}"
    by_string = llm.generate("the quick brown fox", SamplingParams(temperature=0.0, max_tokens=16,
                                                                   ignore_eos=True, stop=[stop_text]),
                             use_tqdm=False)[0].outputs[0]
    assert by_string.finish_reason == "stop" and by_string.stop_reason == stop_text
    assert by_string.text == free_run.text[:free_run.text.index(stop_text)]
    assert _all_free(llm)


def test_seeded_sampling_is_reproducible_whatever_the_batch(llm):
    seeded = SamplingParams(temperature=1.0, top_p=0.9, max_tokens=10, ignore_eos=True, seed=1234)
    alone = llm.generate(["a lazy dog"], seeded, use_tqdm=False)[0].outputs[0].token_ids
    noisy = SamplingParams(temperature=1.0, max_tokens=10, ignore_eos=True)
    batch = llm.generate(["the sun", "a lazy dog", "moon and sun"], [noisy, seeded, noisy], use_tqdm=False)
    assert batch[1].outputs[0].token_ids == alone
    other_seed = SamplingParams(temperature=1.0, top_p=0.9, max_tokens=10, ignore_eos=True, seed=4321)
    assert llm.generate(["a lazy dog"], other_seed, use_tqdm=False)[0].outputs[0].token_ids != alone


def test_abort_returns_self_and_cross_blocks(llm):
    engine = llm.llm_engine
    before = _free_blocks(llm)
    params = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)
    for i in range(3):
        engine.add_request(f"abort-{i}", "the quick brown fox jumps", params)
    engine.step()
    engine.step()
    assert engine.scheduler.block_manager.cross_block_tables  # the encoder output lives in cross blocks
    assert _free_blocks(llm) != before
    engine.abort_request(["abort-0", "abort-1", "abort-2"])
    assert not engine.has_unfinished_requests()
    assert _free_blocks(llm) == before and not engine.scheduler.block_manager.cross_block_tables
    assert engine.model_runner.input_batch.num_live_rows == 0


def test_eos_stops_unless_ignored(llm):
    output = llm.generate(TokensPrompt(prompt_token_ids=[0, 5, 6, 2]),
                          SamplingParams(temperature=0.0, max_tokens=64), use_tqdm=False)[0].outputs[0]
    if output.finish_reason == "stop":
        assert output.token_ids[-1] == 2 and output.stop_reason is None
    else:
        assert 2 not in output.token_ids and len(output.token_ids) == 64


def test_bad_requests_raise_clear_errors_and_leak_nothing(llm, bart_with_tokenizer):
    with pytest.raises(ValueError, match="max_source_positions"):
        llm.generate(TokensPrompt(prompt_token_ids=[5] * 500), SamplingParams(max_tokens=4), use_tqdm=False)
    with pytest.raises(ValueError, match="vocab"):
        llm.generate(TokensPrompt(prompt_token_ids=[5, 100000]), SamplingParams(max_tokens=4), use_tqdm=False)
    with pytest.raises(ValueError, match="max_tokens"):
        llm.generate("the sun", SamplingParams(max_tokens=1000), use_tqdm=False)
    with pytest.raises(ValueError, match="sampling_params"):
        llm.generate(["a", "b"], [SamplingParams()], use_tqdm=False)
    with pytest.raises(ValueError, match="best_of=300 exceeds max_num_seqs=256"):
        llm.generate("the sun", SamplingParams(n=2, best_of=300, temperature=1.0), use_tqdm=False)
    assert not llm.llm_engine.has_unfinished_requests() and _all_free(llm)
    no_tokenizer = LLM(bart_with_tokenizer[0], skip_tokenizer_init=True, kv_cache_space_gb=0.01)
    with pytest.raises(ValueError, match="skip_tokenizer_init"):
        no_tokenizer.generate("the sun", use_tqdm=False)
    output = no_tokenizer.generate(TokensPrompt(prompt_token_ids=[0, 7, 2]), SamplingParams(max_tokens=3),
                                   use_tqdm=False)[0]
    assert output.outputs[0].text == "" and len(output.outputs[0].token_ids) <= 3


def test_unsupported_architecture_and_missing_model_dir_are_clear(tmp_path):
    with pytest.raises((OSError, ValueError)):
        LLM(str(tmp_path / "missing"))
    config = build_tiny_model("gpt2", tmp_path)[1].config
    config.architectures = ["NoSuchModelForCausalLM"]
    config.save_pretrained(tmp_path / "gpt2")
    with pytest.raises(ValueError, match="NoSuchModelForCausalLM"):
        LLM(str(tmp_path / "gpt2"), skip_tokenizer_init=True)


def test_kv_cache_size_is_logged(bart_with_tokenizer, caplog):
    import logging
    logger = logging.getLogger("seq2seq_engine")
    logger.addHandler(caplog.handler)
    try:
        with caplog.at_level(logging.INFO, logger="seq2seq_engine"):
            llm = LLM(bart_with_tokenizer[0], kv_cache_space_gb=0.01, swap_space_gb=0.005, block_size=8)
    finally:
        logger.removeHandler(caplog.handler)
    config = llm.llm_engine.cache_config
    assert f"{config.num_gpu_blocks} device blocks" in caplog.text
    assert f"{config.num_cpu_blocks} CPU swap blocks" in caplog.text
    # 0.01 GiB over (2 layers × K and V × 8 slots × 4 heads × 16 dims × 4 bytes) per block.
    assert config.num_gpu_blocks == int(0.01 * (1 << 30)) // (2 * 2 * 8 * 4 * 16 * 4)


def test_min_tokens_keeps_eos_and_stop_tokens_out_until_reached(llm):
    free_run = llm.generate(TokensPrompt(prompt_token_ids=[0, 5, 6, 2]),
                            SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True),
                            use_tqdm=False)[0].outputs[0]
    banned = free_run.token_ids[0]
    output = llm.generate(TokensPrompt(prompt_token_ids=[0, 5, 6, 2]),
                          SamplingParams(temperature=0.0, max_tokens=12, min_tokens=5, stop_token_ids=[banned]),
                          use_tqdm=False)[0].outputs[0]
    assert len(output.token_ids) >= 5
    assert banned not in output.token_ids[:5] and 2 not in output.token_ids[:5]
    # As in vLLM, EOS stays banned under min_tokens even with ignore_eos: force EOS to be the argmax otherwise.
    prefer_eos = SamplingParams(temperature=0.0, max_tokens=6, min_tokens=4, ignore_eos=True,
                                logits_processors=[lambda ids, logits: logits.index_fill(0, torch.tensor([2]), 1e4)])
    eos_output = llm.generate(TokensPrompt(prompt_token_ids=[0, 5, 6, 2]), prefer_eos, use_tqdm=False)[0].outputs[0]
    assert 2 not in eos_output.token_ids[:4] and eos_output.token_ids[4:] == [2, 2]


def test_prompt_logprobs_of_a_text_prompt_score_the_default_decoder_prompt(llm, bart_with_tokenizer):
    _, hf_model, tokenizer = bart_with_tokenizer
    output = llm.generate("the sun", SamplingParams(max_tokens=2, prompt_logprobs=2), use_tqdm=False)[0]
    assert output.prompt_token_ids == [2, 0]
    with torch.no_grad():
        logits = hf_model(input_ids=torch.tensor([tokenizer("the sun").input_ids]),
                          decoder_input_ids=torch.tensor([[2, 0]])).logits[0, 0]
    reference = torch.log_softmax(logits, dim=-1)
    top_ids = reference.topk(2).indices.tolist()
    assert output.prompt_logprobs[0] is None and len(output.prompt_logprobs) == 2
    assert set(output.prompt_logprobs[1]) == {0, *top_ids}
    for token_id, logprob in output.prompt_logprobs[1].items():
        assert abs(logprob - float(reference[token_id])) < 1e-4
    assert not llm.llm_engine.has_unfinished_requests() and _all_free(llm)


def test_logits_processors_see_outputs_and_steer_sampling(llm):
    seen = []

    def only_token_7_then_9(output_token_ids, logits):
        seen.append(list(output_token_ids))
        forced = torch.full_like(logits, float("-inf"))
        forced[7 if len(output_token_ids) % 2 == 0 else 9] = 0.0
        return forced

    output = llm.generate("the sun", SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True,
                                                    logits_processors=[only_token_7_then_9]),
                          use_tqdm=False)[0].outputs[0]
    assert output.token_ids == [7, 9, 7, 9]
    assert seen == [[], [7], [7, 9], [7, 9, 7]]
    with pytest.raises(TypeError, match="logits_processors"):
        SamplingParams(logits_processors=[3])


@pytest.mark.parametrize("field", ["logprobs", "prompt_logprobs"])
def test_logprobs_above_max_logprobs_are_refused_at_request_time(llm, field):
    with pytest.raises(ValueError, match=f"{field}=21 exceeds max_logprobs=20"):
        llm.generate(TokensPrompt(prompt_token_ids=[0, 5, 2]), SamplingParams(**{field: 21}), use_tqdm=False)
    output = llm.generate(TokensPrompt(prompt_token_ids=[0, 5, 2]), SamplingParams(max_tokens=1, **{field: 20}),
                          use_tqdm=False)[0]
    assert output.finished and not llm.llm_engine.has_unfinished_requests() and _all_free(llm)
