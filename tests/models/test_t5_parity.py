"""T5 / T5 v1.1 / mT5 / UMT5 through LLM against HF transformers on random-initialised checkpoints: greedy tokens
identical to HF with logprobs within 1e-4 (float32; mixed encoder and decoder prompt lengths, also with KV pools
small enough to force recompute and swap preemption), the best beam identical to HF `generate`, bfloat16 runs,
float16 refused."""
import copy

import pytest
import torch
from generate_reference import hf_beam_generate
from hf_reference import hf_greedy
from t5_reference import EOS, VARIANTS, VOCAB, build_tiny_t5

from seq2seq_engine import LLM, BeamSearchParams, SamplingParams, TokensPrompt
from seq2seq_engine.inputs.data import ExplicitEncoderDecoderPrompt
from seq2seq_engine.kernels import native
from seq2seq_engine.model_loader.loader import load_model

NUM_TOKENS = 24
ENCODER_LENS = [5, 40, 12, 3, 27, 18, 8, 33]   # longer than max_distance (20): the logarithmic buckets count
ENGINE_VARIANTS = {
    "roomy": {},
    "recompute": {"num_gpu_blocks_override": 40, "preemption_mode": "recompute"},
    "swap": {"num_gpu_blocks_override": 40, "preemption_mode": "swap"},
    "torch-kernels": {},    # the torch decode path instead of the native C kernel
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """variant -> (model directory, HF model), built on first use and shared by the tests of this module."""
    cache = {}

    def get(variant):
        if variant not in cache:
            cache[variant] = build_tiny_t5(variant, tmp_path_factory.mktemp(variant))
        return cache[variant]
    return get


@pytest.fixture(scope="module")
def greedy_references(checkpoints):
    """variant -> HF greedy (tokens, logprobs) of _requests(seed=1), computed once per variant."""
    cache = {}

    def get(variant):
        if variant not in cache:
            _, hf_model = checkpoints(variant)
            cache[variant] = [hf_greedy(hf_model, torch.tensor(encoder), decoder, NUM_TOKENS)
                              for _, encoder, decoder in _requests(seed=1)]
        return cache[variant]
    return get


def _requests(seed):
    """(engine prompt, encoder ids, decoder prompt): odd requests use the default decoder prompt [0]."""
    generator = torch.Generator().manual_seed(seed)
    requests = []
    for i, n in enumerate(ENCODER_LENS):
        encoder = torch.randint(3, VOCAB, (n,), generator=generator).tolist()
        prompt = TokensPrompt(prompt_token_ids=encoder)
        decoder = [0]
        if i % 2 == 0:
            decoder = [0] + torch.randint(3, VOCAB, (i // 2 + 1,), generator=generator).tolist()
            prompt = ExplicitEncoderDecoderPrompt(encoder_prompt=prompt,
                                                  decoder_prompt=TokensPrompt(prompt_token_ids=decoder[1:]))
        requests.append((prompt, encoder, decoder))
    return requests


def _llm(model_dir, dtype="float32", **engine_kwargs):
    return LLM(model_dir, skip_tokenizer_init=True, dtype=dtype, block_size=4, kv_cache_space_gb=0.02,
               **engine_kwargs)


@pytest.mark.parametrize("variant,engine", [(v, "roomy") for v in VARIANTS]
                         + [("t5-v1.1", "recompute"), ("umt5", "swap"), ("t5", "swap"), ("umt5", "torch-kernels"),
                            ("flan-t5", "recompute"), ("flan-t5", "swap"), ("flan-t5", "torch-kernels")])
def test_greedy_matches_hf(variant, engine, checkpoints, greedy_references, monkeypatch, request):
    model_dir, _ = checkpoints(variant)
    if engine == "torch-kernels":
        monkeypatch.setenv(native.NATIVE_ENV, "0")
        native.load_library.cache_clear()
        request.addfinalizer(native.load_library.cache_clear)   # before monkeypatch restores the switch
        assert native.load_library("paged_attention_cpu") is None
    requests = _requests(seed=1)
    llm = _llm(model_dir, **ENGINE_VARIANTS[engine])
    params = SamplingParams(temperature=0.0, max_tokens=NUM_TOKENS, ignore_eos=True, logprobs=0)
    outputs = llm.generate([prompt for prompt, _, _ in requests], params, use_tqdm=False)
    for output, (_, _, decoder), (ref_tokens, ref_logprobs) in zip(outputs, requests, greedy_references(variant)):
        completion = output.outputs[0]
        assert output.prompt_token_ids == decoder
        assert completion.token_ids == ref_tokens
        ours = torch.tensor([lp[t] for lp, t in zip(completion.logprobs, completion.token_ids)])
        torch.testing.assert_close(ours, torch.tensor(ref_logprobs), rtol=0, atol=1e-4)
    scheduler = llm.llm_engine.scheduler
    assert scheduler.block_manager.get_num_free_gpu_blocks() == llm.llm_engine.cache_config.num_gpu_blocks
    if engine in ("recompute", "swap"):
        assert scheduler.num_cumulative_preemption > 0


@pytest.mark.parametrize("variant,engine", [("t5", "roomy"), ("umt5", "roomy"), ("t5-v1.1", "swap"),
                                            ("flan-t5", "swap")])
def test_best_beam_matches_hf_generate(variant, engine, checkpoints):
    model_dir, hf_model = checkpoints(variant)
    requests = _requests(seed=2)[:5]
    llm = _llm(model_dir, **ENGINE_VARIANTS[engine])
    for width, length_penalty in [(2, 1.0), (4, 0.8)]:
        params = BeamSearchParams(beam_width=width, max_tokens=12, length_penalty=length_penalty)
        outputs = llm.beam_search([prompt for prompt, _, _ in requests], params, use_tqdm=False)
        for output, (_, encoder, decoder) in zip(outputs, requests):
            (best_tokens, best_score), *_ = hf_beam_generate(
                hf_model, encoder, decoder, num_beams=width, num_return_sequences=width, max_new_tokens=12,
                length_penalty=length_penalty, early_stopping=False, min_length=0,
                use_cache=False)   # transformers' cache assumes num_decoder_layers == num_layers
            assert output.outputs[0].token_ids == best_tokens, (variant, width, encoder)
            assert output.outputs[0].beam_score == pytest.approx(best_score, abs=1e-4)
    assert (llm.llm_engine.scheduler.num_cumulative_preemption > 0) == (engine == "swap")


@pytest.mark.parametrize("variant,reads_states", [("flan-t5", True), ("t5-v1.1", False), ("mt5", False)])
def test_cross_attention_reads_encoder_states_where_they_fit_a_cache_row(variant, reads_states, checkpoints,
                                                                         monkeypatch):
    """Where d_model == num_heads * d_kv no layer projects cross K/V: every layer reads the encoder states, cached
    once (in the first layer's K blocks); elsewhere each layer projects and caches its own K/V."""
    model_dir, _ = checkpoints(variant)
    llm = _llm(model_dir)
    decoder = llm.llm_engine.model_runner.model.decoder
    projections = []
    for block in decoder.block:
        cross = block.layer[1].EncDecAttention
        assert cross.attends_encoder_states() == reads_states

        def counted(rows, project=cross.kv.forward):
            projections.append(rows.shape)
            return project(rows)
        monkeypatch.setattr(cross.kv, "forward", counted)
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    outputs = llm.generate([prompt for prompt, _, _ in _requests(seed=4)], params, use_tqdm=False)
    assert all(len(output.outputs[0].token_ids) == 4 for output in outputs)
    assert bool(projections) != reads_states


@pytest.mark.parametrize("variant", ["t5-v1.1", "flan-t5"])
def test_bfloat16_runs_and_agrees_with_hf_in_bfloat16(variant, checkpoints):
    model_dir, hf_model = checkpoints(variant)
    hf_bfloat16 = copy.deepcopy(hf_model).to(torch.bfloat16)
    requests = _requests(seed=3)
    llm = _llm(model_dir, dtype="bfloat16")
    assert llm.llm_engine.cache_engine.device_cache[0][0].dtype == torch.bfloat16
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    outputs = llm.generate([prompt for prompt, _, _ in requests], params, use_tqdm=False)
    references = [hf_greedy(hf_bfloat16, torch.tensor(e), d, 8)[0] for _, e, d in requests]
    # bfloat16 rounding (ours and HF's differ in the order of operations) lets later tokens drift; the first
    # ones must agree, and most sequences entirely.
    ours = [o.outputs[0].token_ids for o in outputs]
    assert sum(o[0] == r[0] for o, r in zip(ours, references)) >= 7
    assert sum(o == r for o, r in zip(ours, references)) >= 5


def test_float16_is_refused(checkpoints):
    model_dir, _ = checkpoints("t5")
    with pytest.raises(ValueError, match="float16.*T5ForConditionalGeneration.*bfloat16"):
        load_model(model_dir, torch.float16, "cpu")
    with pytest.raises(ValueError, match="float16"):
        _llm(model_dir, dtype="float16")


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_loaded_model_shape_and_head(variant, checkpoints):
    model_dir, hf_model = checkpoints(variant)
    ours, _ = load_model(model_dir, torch.float32, "cpu")
    config = hf_model.config
    assert type(ours).__name__ == type(hf_model).__name__
    assert ours.kv_cache_spec() == (config.num_decoder_layers, config.num_heads, config.d_kv)
    untied = VARIANTS[variant][2].get("tie_word_embeddings") is False
    if untied:
        assert ours.lm_head is not None and ours.tied_lm_head_weight() is None
        own_weight = ours.lm_head.weight      # None where oneDNN's packed copy replaced it
        assert own_weight is None or own_weight.data_ptr() != ours.shared.weight.data_ptr()
    else:  # tied: no head of its own, or the oneDNN-packed head over the very embedding matrix
        assert ours.lm_head is None or ours.lm_head.weight.data_ptr() == ours.shared.weight.data_ptr()
    assert ours.output_scale == (1.0 if untied else config.d_model ** -0.5)
    tables = [name for name, _ in ours.named_parameters() if "relative_attention_bias" in name]
    per_block = 2 * config.num_layers + (config.num_decoder_layers - config.num_layers)
    assert len(tables) == (per_block if variant == "umt5" else 2)
    assert EOS == config.eos_token_id
