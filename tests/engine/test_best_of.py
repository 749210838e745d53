"""n / best_of sampling: best_of sequences share the prompt's blocks, sample independently (checked against HF
log-probs and the model's distribution), the n most likely are returned, and seeded requests do not depend on the
batch they run in."""
import pytest
import torch
from hf_reference import build_tiny_model

from seq2seq_engine import LLM, SamplingParams, TokensPrompt

VOCAB = 32


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return {arch: build_tiny_model(arch, tmp_path_factory.mktemp(arch), vocab_size=VOCAB)
            for arch in ("bart", "llama")}


def _tokens(n, seed):
    return torch.randint(4, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _all_free(llm):
    manager, config = llm.llm_engine.scheduler.block_manager, llm.llm_engine.cache_config
    return (manager.get_num_free_gpu_blocks() == config.num_gpu_blocks
            and manager.get_num_free_cpu_blocks() == config.num_cpu_blocks)


@torch.no_grad()
def _hf_logprobs(arch, hf_model, prompt, tokens):
    """HF's log-prob of each generated token, from one full forward over prompt + tokens."""
    if arch == "bart":
        decoder = [2, 0] + tokens
        logits = hf_model(input_ids=torch.tensor([prompt]), decoder_input_ids=torch.tensor([decoder])).logits[0]
        start = 1
    else:
        logits = hf_model(input_ids=torch.tensor([prompt + tokens])).logits[0]
        start = len(prompt) - 1
    log_probs = torch.log_softmax(logits.float(), dim=-1)
    return [float(log_probs[start + i, t]) for i, t in enumerate(tokens)]


@pytest.mark.parametrize("arch,chunked", [("bart", False), ("llama", False), ("llama", True)])
def test_n_most_likely_of_best_of_independent_samples(arch, chunked, tiny):
    model_dir, hf_model = tiny[arch]
    # Chunked: the shared prompt (up to 40 tokens, the last block full or not) is written over several steps.
    chunking = dict(enable_chunked_prefill=True, max_num_batched_tokens=16) if chunked else {}
    llm = LLM(model_dir, skip_tokenizer_init=True, block_size=4, kv_cache_space_gb=0.01, **chunking)
    prompts = [TokensPrompt(prompt_token_ids=_tokens(n, n)) for n in (6, 13, 21, 40)]
    every = llm.generate(prompts, SamplingParams(n=5, temperature=1.0, seed=3, max_tokens=8, logprobs=0),
                         use_tqdm=False)
    best = llm.generate(prompts, SamplingParams(n=2, best_of=5, temperature=1.0, seed=3, max_tokens=8, logprobs=0),
                        use_tqdm=False)
    for prompt, all_five, top_two in zip(prompts, every, best):
        assert len(all_five.outputs) == 5 and len(top_two.outputs) == 2
        samples = [c.token_ids for c in all_five.outputs]
        assert len({tuple(s) for s in samples}) > 1, "best_of sequences must sample independently"
        for completion in all_five.outputs + top_two.outputs:
            reference = _hf_logprobs(arch, hf_model, prompt["prompt_token_ids"], completion.token_ids)
            ours = [lp[t] for lp, t in zip(completion.logprobs, completion.token_ids)]
            assert ours == pytest.approx(reference, abs=1e-4)
            assert completion.cumulative_logprob == pytest.approx(sum(reference), abs=1e-3)
        # The same seed draws the same five sequences; the two returned are the most likely of them.
        ranked = sorted(all_five.outputs, key=lambda c: c.cumulative_logprob, reverse=True)
        assert [c.token_ids for c in top_two.outputs] == [c.token_ids for c in ranked[:2]]
    assert _all_free(llm)


def test_seeded_best_of_requests_do_not_depend_on_the_batch(tiny):
    model_dir, _ = tiny["llama"]
    x = (TokensPrompt(prompt_token_ids=_tokens(9, 1)), SamplingParams(n=2, best_of=4, temperature=0.9, seed=7,
                                                                      max_tokens=10))
    y = (TokensPrompt(prompt_token_ids=_tokens(17, 2)), SamplingParams(n=3, temperature=1.0, top_k=8, seed=11,
                                                                       max_tokens=12))
    others = [(TokensPrompt(prompt_token_ids=_tokens(n, 10 + n)), SamplingParams(n=2, temperature=1.0, max_tokens=9))
              for n in (4, 25, 11)]
    alone = LLM(model_dir, skip_tokenizer_init=True, block_size=4, kv_cache_space_gb=0.01)
    first = alone.generate([x[0], y[0]], [x[1], y[1]], use_tqdm=False)
    # Another mix, in another order, in a pool small enough that the multi-sequence requests get swapped out.
    crowded = LLM(model_dir, skip_tokenizer_init=True, block_size=4, num_gpu_blocks_override=24, swap_space_gb=0.01)
    mix = [others[0], y, others[1], x, others[2]]
    second = crowded.generate([p for p, _ in mix], [s for _, s in mix], use_tqdm=False)
    assert crowded.llm_engine.scheduler.num_cumulative_preemption > 0
    assert [c.token_ids for c in second[3].outputs] == [c.token_ids for c in first[0].outputs]
    assert [c.token_ids for c in second[1].outputs] == [c.token_ids for c in first[1].outputs]
    assert _all_free(alone) and _all_free(crowded)


def test_prefill_row_is_sampled_best_of_times_from_the_model_distribution(tiny):
    model_dir, hf_model = tiny["llama"]
    llm = LLM(model_dir, skip_tokenizer_init=True, block_size=4, kv_cache_space_gb=0.01)
    prompt = _tokens(7, 4)
    output = llm.generate(TokensPrompt(prompt_token_ids=prompt),
                          SamplingParams(n=200, temperature=1.0, seed=0, max_tokens=1), use_tqdm=False)[0]
    counts = torch.bincount(torch.tensor([c.token_ids[0] for c in output.outputs]), minlength=VOCAB).float()
    with torch.no_grad():
        probs = torch.softmax(hf_model(input_ids=torch.tensor([prompt])).logits[0, -1].float(), dim=-1)
    total_variation = 0.5 * (counts / counts.sum() - probs).abs().sum()
    assert total_variation < 0.15, (total_variation, counts, probs)


def test_best_of_sequences_share_prompt_blocks(tiny):
    model_dir, _ = tiny["bart"]
    llm = LLM(model_dir, skip_tokenizer_init=True, block_size=4, kv_cache_space_gb=0.01)
    engine, manager = llm.llm_engine, llm.llm_engine.scheduler.block_manager
    engine.add_request("r", TokensPrompt(prompt_token_ids=_tokens(30, 5)),
                       SamplingParams(n=4, temperature=1.0, seed=1, max_tokens=6))
    prepared = []
    prepare_inputs = engine.model_runner.prepare_inputs
    engine.model_runner.prepare_inputs = lambda metadata_list: prepared.append(prepare_inputs(metadata_list)) \
        or prepared[-1]
    engine.step()  # the prefill: the encoder and the decoder prompt run once, four samples from its last row
    del engine.model_runner.prepare_inputs
    assert prepared[0].input_ids.tolist() == [2, 0] and len(prepared[0].encoder_input_ids) == 30
    assert prepared[0].selected_token_indices.tolist() == [1, 1, 1, 1] and len(prepared[0].sampled_seq_ids) == 4
    group = engine.scheduler.running[0]
    tables = [manager.block_tables[seq.seq_id] for seq in group.get_seqs()]
    assert len(tables) == 4 and all(table[0] is tables[0][0] for table in tables)
    assert tables[0][0].ref_count == 4 and len(manager.cross_block_tables) == 1
    while engine.has_unfinished_requests():
        engine.step()
    assert _all_free(llm)
