"""Beam search inside the engine: beams share KV blocks copy-on-write and one cross table per request, every block
comes back, preemption (swap) of beam requests changes no output, text and stop tokens, and clear request errors."""
import pytest
import torch
from hf_reference import build_tiny_model

from seq2seq_engine import LLM, BeamSearchParams, SamplingParams, TokensPrompt
from seq2seq_engine.config import SchedulerConfig
from seq2seq_engine.inputs.data import ExplicitEncoderDecoderPrompt

VOCAB = 32


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory):
    return {arch: build_tiny_model(arch, tmp_path_factory.mktemp(arch), vocab_size=VOCAB)[0]
            for arch in ("bart", "llama")}


def _random_tokens(n, seed):
    return torch.randint(4, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _all_free(llm):
    """Every block back in its pool, and no model-runner row left to a dropped beam."""
    manager, config = llm.llm_engine.scheduler.block_manager, llm.llm_engine.cache_config
    return (manager.get_num_free_gpu_blocks() == config.num_gpu_blocks
            and manager.get_num_free_cpu_blocks() == config.num_cpu_blocks
            and not manager.block_tables and not manager.cross_block_tables
            and llm.llm_engine.model_runner.input_batch.num_live_rows == 0)


def _peak_blocks(llm, prompt, params):
    """Run one request alone; the most device blocks it held at any step (measured after scheduling, when the
    step's new and copied blocks are allocated), and the largest ref_count of a self block."""
    engine, manager = llm.llm_engine, llm.llm_engine.scheduler.block_manager
    total = engine.cache_config.num_gpu_blocks
    engine.add_request("measured", prompt, params)
    peak = max_shared = 0
    while engine.has_unfinished_requests():
        metadata_list, outputs = engine.scheduler.schedule()
        peak = max(peak, total - manager.get_num_free_gpu_blocks())
        assert len(manager.cross_block_tables) <= 1  # one cross table per request, whatever the beam count
        for table in manager.cross_block_tables.values():
            assert all(block.ref_count == 1 for block in table)  # shared by the beams, never forked or copied
        assert len({tuple(m.cross_block_table or ()) for m in metadata_list}) <= 1
        max_shared = max([max_shared] + [b.ref_count for t in manager.block_tables.values() for b in t])
        engine.scheduler.schedule = lambda: (metadata_list, outputs)  # replay this schedule in step()
        try:
            engine.step()
        finally:
            del engine.scheduler.schedule
    assert _all_free(llm)
    return peak, max_shared


@pytest.mark.parametrize("arch", ["bart", "llama"])
def test_beams_share_blocks_and_return_every_one(arch, tiny_models):
    llm = LLM(tiny_models[arch], skip_tokenizer_init=True, block_size=4, kv_cache_space_gb=0.01)
    if arch == "bart":  # 40 encoder tokens: 10 cross blocks; 20 decoder prompt tokens: 5 self blocks
        prompt = ExplicitEncoderDecoderPrompt(encoder_prompt=TokensPrompt(prompt_token_ids=_random_tokens(40, 1)),
                                              decoder_prompt=TokensPrompt(prompt_token_ids=_random_tokens(19, 2)))
    else:
        prompt = TokensPrompt(prompt_token_ids=_random_tokens(30, 3))
    greedy_peak, _ = _peak_blocks(llm, prompt, SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True))
    beam_peak, max_shared = _peak_blocks(llm, prompt, BeamSearchParams(beam_width=4, max_tokens=20, ignore_eos=True))
    print(f"\n{arch}: peak device blocks, greedy {greedy_peak}, beam-4 {beam_peak}; most tables sharing a block "
          f"{max_shared}")
    assert beam_peak < 4 * greedy_peak
    assert max_shared == 4  # the prompt blocks are held by all four beams at once
    cross = 10 if arch == "bart" else 0
    # Unshared, four beams would each hold a copy of the prompt's self blocks.
    assert beam_peak < cross + 4 * (greedy_peak - cross)


@pytest.mark.parametrize("arch,preemption_mode", [("bart", "recompute"), ("bart", "swap"), ("llama", "recompute")])
def test_tiny_pool_preempts_beam_requests_without_changing_outputs(arch, preemption_mode, tiny_models):
    if arch == "bart":
        prompts = [TokensPrompt(prompt_token_ids=_random_tokens(n, 10 + n)) for n in (12, 30, 7, 22, 16, 9)]
    else:
        prompts = [TokensPrompt(prompt_token_ids=_random_tokens(n, 20 + n)) for n in (5, 18, 11, 3, 14, 8)]
    params = [BeamSearchParams(beam_width=width, max_tokens=16, length_penalty=lp, early_stopping=es)
              for width, lp, es in [(4, 1.0, False), (2, 2.0, True), (1, 1.0, False), (3, 0.8, "never"),
                                    (4, 1.5, True), (1, 0.5, False)]]
    roomy = LLM(tiny_models[arch], skip_tokenizer_init=True, block_size=4, kv_cache_space_gb=0.01)
    expected = roomy.beam_search(prompts, params, use_tqdm=False)
    tight = LLM(tiny_models[arch], skip_tokenizer_init=True, block_size=4, num_gpu_blocks_override=28,
                swap_space_gb=0.01, preemption_mode=preemption_mode)
    outputs = tight.beam_search(prompts, params, use_tqdm=False)
    assert tight.llm_engine.scheduler.num_cumulative_preemption > 0
    for got, want in zip(outputs, expected):
        assert got.ignored_reason is None
        assert [(c.token_ids, c.finish_reason) for c in got.outputs] == \
            [(c.token_ids, c.finish_reason) for c in want.outputs]
        assert [c.cumulative_logprob for c in got.outputs] == pytest.approx(
            [c.cumulative_logprob for c in want.outputs], abs=1e-4)
    assert _all_free(tight) and _all_free(roomy)


def test_beam_request_with_no_swap_space_is_ignored_and_frees_its_blocks(tiny_models):
    llm = LLM(tiny_models["llama"], skip_tokenizer_init=True, block_size=4, num_gpu_blocks_override=12,
              swap_space_gb=0.0)
    prompts = [TokensPrompt(prompt_token_ids=_random_tokens(n, n)) for n in (9, 10)]
    outputs = llm.beam_search(prompts, BeamSearchParams(beam_width=4, max_tokens=24, ignore_eos=True),
                              use_tqdm=False)
    ignored = [o for o in outputs if o.ignored_reason]
    assert ignored and all("no CPU swap space" in o.ignored_reason for o in ignored)
    assert all(o.finished for o in outputs) and _all_free(llm)


@pytest.mark.parametrize("include_stop", [False, True])
def test_text_prompts_and_stop_token_ids_match_hf(bart_with_tokenizer, include_stop):
    model_dir, hf_model, tokenizer = bart_with_tokenizer
    llm = LLM(model_dir, block_size=4, kv_cache_space_gb=0.01)
    text = "the quick brown fox jumps over the lazy dog"
    free_run = llm.beam_search(text, BeamSearchParams(beam_width=3, max_tokens=12, ignore_eos=True),
                               use_tqdm=False)[0]
    stop_token = free_run.outputs[0].token_ids[4]
    params = BeamSearchParams(beam_width=3, max_tokens=12, stop_token_ids=[stop_token],
                              include_stop_str_in_output=include_stop)
    output = llm.beam_search([text], params, use_tqdm=False)[0]
    hf = hf_model.generate(input_ids=torch.tensor([tokenizer(text).input_ids]),
                           decoder_input_ids=torch.tensor([[2, 0]]), num_beams=3, num_return_sequences=3,
                           max_new_tokens=12, eos_token_id=[2, stop_token], do_sample=False, forced_eos_token_id=None)
    hf_best = hf[0, 2:].tolist()
    best = output.outputs[0]
    assert best.token_ids == hf_best[:len(best.token_ids)] and set(hf_best[len(best.token_ids):]) <= {1}
    for completion in output.outputs:
        stopped = completion.token_ids[-1] == stop_token
        assert completion.finish_reason == ("stop" if stopped else "length")
        assert completion.stop_reason == (stop_token if stopped else None)
        kept = completion.token_ids if include_stop or not stopped else completion.token_ids[:-1]
        assert completion.text == tokenizer.decode(kept, skip_special_tokens=True)
    assert any(c.finish_reason == "stop" for c in output.outputs)
    assert _all_free(llm)


def test_bad_beam_requests_fail_at_request_time_and_leak_nothing(tiny_models):
    with pytest.raises(ValueError, match="beam_width must be >= 1, got 0"):
        BeamSearchParams(beam_width=0, max_tokens=4)
    with pytest.raises(ValueError, match="temperature must be 0"):
        BeamSearchParams(beam_width=2, max_tokens=4, temperature=0.7)
    with pytest.raises(ValueError, match="early_stopping"):
        BeamSearchParams(beam_width=2, max_tokens=4, early_stopping="sometimes")
    with pytest.raises(ValueError, match="min_tokens"):
        BeamSearchParams(beam_width=2, max_tokens=4, min_tokens=5)
    with pytest.raises(ValueError, match="max_beam_width \\(8\\) must be <= max_num_seqs \\(4\\)"):
        SchedulerConfig(max_num_seqs=4, max_beam_width=8)
    assert SchedulerConfig().max_beam_width == 16 and SchedulerConfig(max_num_seqs=6).max_beam_width == 6
    llm = LLM(tiny_models["llama"], skip_tokenizer_init=True, block_size=4, kv_cache_space_gb=0.01, max_num_seqs=8)
    prompts = [TokensPrompt(prompt_token_ids=[5, 6, 7]), TokensPrompt(prompt_token_ids=[8, 9])]
    with pytest.raises(ValueError, match="beam_width=9 exceeds max_beam_width=8"):
        llm.beam_search(prompts, [BeamSearchParams(beam_width=2, max_tokens=4),
                                  BeamSearchParams(beam_width=9, max_tokens=4)], use_tqdm=False)
    with pytest.raises(TypeError, match="BeamSearchParams"):
        llm.beam_search(prompts, SamplingParams(), use_tqdm=False)
    with pytest.raises(ValueError, match="got 1 params for 2 prompts"):
        llm.beam_search(prompts, [BeamSearchParams(beam_width=2, max_tokens=4)], use_tqdm=False)
    with pytest.raises(ValueError, match="best_of=9 exceeds max_num_seqs=8"):
        llm.generate(prompts, SamplingParams(n=1, best_of=9, temperature=1.0), use_tqdm=False)
    assert not llm.llm_engine.has_unfinished_requests() and _all_free(llm)
