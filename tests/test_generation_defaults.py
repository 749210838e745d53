"""generation_config.json as request defaults: the conversion rules, overrides, errors, and end-to-end runs with no
params against HF `generate()` reading the same generation config (random tiny BART with beams, tiny Llama greedy)."""
import json

import pytest
import torch
from hf_reference import build_tiny_model

from seq2seq_engine import LLM, BeamSearchParams, GenerationDefaults, SamplingParams, TokensPrompt

CNN_LIKE = {"num_beams": 4, "length_penalty": 2.0, "min_length": 56, "max_length": 142, "no_repeat_ngram_size": 3,
            "early_stopping": True, "forced_bos_token_id": 0, "forced_eos_token_id": 2, "decoder_start_token_id": 2}


def _defaults(tmp_path, values):
    (tmp_path / "generation_config.json").write_text(json.dumps(values), encoding="utf-8")
    return GenerationDefaults.from_model_dir(str(tmp_path))


def test_bart_large_cnn_style_file_gives_beam_search_with_hf_lengths(tmp_path):
    params = _defaults(tmp_path, CNN_LIKE).request_params(decoder_prompt_len=2)
    assert isinstance(params, BeamSearchParams)
    assert (params.beam_width, params.length_penalty, params.early_stopping) == (4, 2.0, True)
    # HF counts max/min_length over the decoder sequence: the default prompt [2, 0] takes 2 of them.
    assert (params.max_tokens, params.min_tokens) == (140, 54)
    assert params.no_repeat_ngram_size == 3 and params.forced_eos_token_id == 2


def test_overrides_win_and_none_overrides_are_ignored(tmp_path):
    defaults = _defaults(tmp_path, CNN_LIKE)
    params = defaults.request_params(2, max_tokens=10, min_tokens=None, length_penalty=1.0)
    assert (params.max_tokens, params.min_tokens, params.length_penalty) == (10, 10, 1.0)
    greedy = defaults.request_params(2, beam_width=1)
    assert isinstance(greedy, SamplingParams) and greedy.temperature == 0.0 and greedy.no_repeat_ngram_size == 3
    sampled = defaults.request_params(2, temperature=0.7, seed=3)
    assert isinstance(sampled, SamplingParams) and sampled.temperature == 0.7 and sampled.seed == 3


def test_max_length_is_capped_by_the_model_length_and_decoder_only_counts_the_prompt(tmp_path):
    defaults = _defaults(tmp_path, {"max_length": 100, "min_length": 30})
    assert defaults.sampling_params(decoder_prompt_len=25).max_tokens == 75
    assert defaults.sampling_params(decoder_prompt_len=25).min_tokens == 5
    assert defaults.sampling_params(decoder_prompt_len=25, max_model_len=64).max_tokens == 39
    new_tokens = _defaults(tmp_path, {"max_new_tokens": 7, "max_length": 100}).sampling_params(25)
    assert new_tokens.max_tokens == 7


def test_sampling_file_and_missing_file(tmp_path):
    params = _defaults(tmp_path, {"do_sample": True, "temperature": 0.6, "top_p": 0.9}).request_params(1)
    assert (params.temperature, params.top_p, params.top_k) == (0.6, 0.9, 50)  # HF's top_k default
    empty = GenerationDefaults.from_model_dir(str(tmp_path / "nowhere"))
    assert empty.request_params(1).temperature == 0.0 and empty.request_params(1).max_tokens == 19


def test_bad_overrides_and_bad_files_are_clear_errors(tmp_path):
    defaults = _defaults(tmp_path, CNN_LIKE)
    with pytest.raises(ValueError, match="top_p cannot be set for beam search"):
        defaults.request_params(2, top_p=0.5)
    with pytest.raises(ValueError, match="max_new_tokens cannot be set"):
        defaults.request_params(2, beam_width=1, max_new_tokens=3)
    (tmp_path / "generation_config.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(ValueError, match="not valid JSON"):
        GenerationDefaults.from_model_dir(str(tmp_path))


def _save_generation_config(hf_model, model_dir, **values):
    hf_model.generation_config.update(**values)
    hf_model.generation_config.save_pretrained(model_dir)


def test_bart_without_params_follows_its_generation_config_like_hf_generate(tmp_path):
    model_dir, hf_model = build_tiny_model("bart", tmp_path, vocab_size=32)
    _save_generation_config(hf_model, model_dir, num_beams=3, length_penalty=2.0, min_length=6, max_length=18,
                            no_repeat_ngram_size=3, early_stopping=True, forced_bos_token_id=0,
                            forced_eos_token_id=2)
    generator = torch.Generator().manual_seed(3)
    encoder_prompts = [torch.randint(4, 32, (n,), generator=generator).tolist() for n in (4, 23, 11, 35)]
    llm = LLM(model_dir, skip_tokenizer_init=True, block_size=4, kv_cache_space_gb=0.02)
    outputs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in encoder_prompts], use_tqdm=False)
    for prompt, output in zip(encoder_prompts, outputs):
        with torch.no_grad():
            hf = hf_model.generate(torch.tensor([prompt]), return_dict_in_generate=True)
        generated = hf.sequences[0, 1:].tolist()          # after decoder_start: [forced bos 0, ...]
        length = int((hf.beam_indices[0] != -1).sum())
        assert generated[0] == 0 and len(output.outputs) == 3
        assert output.outputs[0].token_ids == generated[1:length]


def test_decoder_only_without_params_and_with_a_dict_of_overrides(tmp_path):
    model_dir, hf_model = build_tiny_model("llama", tmp_path, vocab_size=32)
    _save_generation_config(hf_model, model_dir, max_new_tokens=12, no_repeat_ngram_size=2, repetition_penalty=1.3,
                            do_sample=False)
    generator = torch.Generator().manual_seed(4)
    prompts = [torch.randint(4, 32, (n,), generator=generator).tolist() for n in (3, 9, 20)]
    llm = LLM(model_dir, skip_tokenizer_init=True, block_size=4, kv_cache_space_gb=0.02)
    token_prompts = [TokensPrompt(prompt_token_ids=p) for p in prompts]
    for params, max_new in ((None, 12), ({"max_tokens": 5}, 5)):
        outputs = llm.generate(token_prompts, params, use_tqdm=False)
        for prompt, output in zip(prompts, outputs):
            with torch.no_grad():
                hf = hf_model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt)),
                                       max_new_tokens=max_new)
            assert output.outputs[0].token_ids == hf[0, len(prompt):].tolist()


def test_an_override_longer_than_the_model_is_refused_at_request_time(tmp_path):
    model_dir, _ = build_tiny_model("llama", tmp_path, vocab_size=32)
    llm = LLM(model_dir, skip_tokenizer_init=True, block_size=4, kv_cache_space_gb=0.02)
    with pytest.raises(ValueError, match=r"\+ max_tokens \(500\) = 503 is longer than max_target_positions \(128\)"):
        llm.generate(TokensPrompt(prompt_token_ids=[5, 6, 7]), {"max_tokens": 500}, use_tqdm=False)
    assert not llm.llm_engine.has_unfinished_requests()
