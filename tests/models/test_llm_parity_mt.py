"""LLM.generate and LLM.beam_search on random Marian, M2M100 and Pegasus checkpoints against HF transformers.

Greedy: text, token and explicit encoder/decoder prompts batched together in one engine, identical tokens and
logprobs within 1e-4, also with a KV pool small enough to force preemption (recompute and swap); each family's
default decoder prompt ([decoder_start] alone); M2M100's target language as forced BOS or as decoder prompt.
Beam search: the best beam identical to HF `generate(num_beams=...)` (tokens and score)."""
import pytest
import torch
from hf_reference import hf_greedy
from mt_reference import m2m100_tokenizer, marian_tokenizer, save_model

from seq2seq_engine import LLM, BeamSearchParams, SamplingParams, TextPrompt, TokensPrompt
from seq2seq_engine.inputs.data import ExplicitEncoderDecoderPrompt

NUM_TOKENS = 24
TEXTS = ["hello world the quick brown fox", "lazy dog", "encoder decoder audio speech over the lazy dog jumps",
         "the fox"]
ENGINES = {"roomy": {}, "recompute": dict(num_gpu_blocks_override=30, preemption_mode="recompute"),
           "swap": dict(num_gpu_blocks_override=30, preemption_mode="swap")}


def _tokenizer(family, spm_model_file, spm_tokenizer, folder):
    if family == "marian":
        return marian_tokenizer(spm_model_file, folder)
    if family == "m2m100":
        return m2m100_tokenizer(spm_model_file, folder)
    return spm_tokenizer     # Pegasus: any tokenizer serves text prompts (the model fixes no vocabulary)


def _requests(tokenizer, config, generator):
    """(engine prompt, encoder ids, decoder prompt) of mixed forms; ids computed with the tokenizer directly."""
    start, vocab = config.decoder_start_token_id, config.vocab_size

    def tokens(n):
        return torch.randint(4, vocab - 1, (n,), generator=generator).tolist()

    requests = [(TEXTS[0], tokenizer.encode(TEXTS[0]), [start]),
                (TokensPrompt(prompt_token_ids=tokens(11)), None, [start]),
                (TextPrompt(prompt=TEXTS[2]), tokenizer.encode(TEXTS[2]), [start])]
    decoder = tokens(3)
    requests.append((ExplicitEncoderDecoderPrompt(encoder_prompt=TEXTS[1], decoder_prompt=TokensPrompt(
        prompt_token_ids=decoder)), tokenizer.encode(TEXTS[1]), [start] + decoder))
    encoder, decoder = tokens(19), [start] + tokens(5)
    requests.append((ExplicitEncoderDecoderPrompt(encoder_prompt=TokensPrompt(prompt_token_ids=encoder),
                                                  decoder_prompt=TokensPrompt(prompt_token_ids=decoder)),
                     encoder, decoder))
    requests.append((TextPrompt(prompt=TEXTS[3]), tokenizer.encode(TEXTS[3]), [start]))
    return [(p, e if e is not None else p["prompt_token_ids"], d) for p, e, d in requests]


@pytest.fixture(scope="module", params=["marian", "m2m100", "pegasus"])
def family_case(request, tmp_path_factory, spm_model_file, spm_tokenizer):
    family = request.param
    folder = tmp_path_factory.mktemp(family)
    tokenizer = _tokenizer(family, spm_model_file, spm_tokenizer, str(folder / "tokenizer"))
    model_dir, hf = save_model(family, str(folder / "model"), tokenizer=tokenizer)
    requests = _requests(tokenizer, hf.config, torch.Generator().manual_seed(3))
    references = [hf_greedy(hf, torch.tensor(e), d, NUM_TOKENS) for _, e, d in requests]
    return family, model_dir, hf, requests, references


@pytest.mark.parametrize("engine", list(ENGINES))
def test_mixed_prompt_forms_match_hf_greedy(family_case, engine):
    family, model_dir, _, requests, references = family_case
    llm = LLM(model_dir, dtype="float32", block_size=4, kv_cache_space_gb=0.05, **ENGINES[engine])
    params = SamplingParams(temperature=0.0, max_tokens=NUM_TOKENS, ignore_eos=True, logprobs=0)
    outputs = llm.generate([p for p, _, _ in requests], params, use_tqdm=False)
    for output, (_, encoder, decoder), (ref_tokens, ref_logprobs) in zip(outputs, requests, references):
        assert output.encoder_prompt_token_ids == encoder
        assert output.prompt_token_ids == decoder
        completion = output.outputs[0]
        assert completion.token_ids == ref_tokens
        ours = torch.tensor([lp[t] for lp, t in zip(completion.logprobs, completion.token_ids)])
        torch.testing.assert_close(ours, torch.tensor(ref_logprobs), rtol=0, atol=1e-4)
    if engine != "roomy":
        assert llm.llm_engine.scheduler.num_cumulative_preemption > 0
    manager = llm.llm_engine.scheduler.block_manager
    assert manager.get_num_free_gpu_blocks() == llm.llm_engine.cache_config.num_gpu_blocks


def test_m2m100_target_language_as_forced_bos_or_decoder_prompt(tmp_path, spm_model_file):
    """HF's NLLB/M2M100 recipe, generate(forced_bos_token_id=lang): the engine gives the same tokens with the
    language forced the same way, or given as the decoder prompt [2, lang] (then it is not an output token)."""
    tokenizer = m2m100_tokenizer(spm_model_file, str(tmp_path / "tokenizer"))
    model_dir, hf = save_model("m2m100", str(tmp_path / "model"), tokenizer=tokenizer)
    lang = tokenizer.get_lang_id("de")
    tokenizer.src_lang = "fr"
    encoder = tokenizer.encode(TEXTS[0])
    assert encoder[0] == tokenizer.get_lang_id("fr")
    with torch.no_grad():
        expected = hf.generate(input_ids=torch.tensor([encoder]), forced_bos_token_id=lang, max_new_tokens=10,
                               do_sample=False, num_beams=1, eos_token_id=None)[0].tolist()
    assert expected[:2] == [2, lang]
    llm = LLM(model_dir, dtype="float32", block_size=4, kv_cache_space_gb=0.05)
    forced, prompted = llm.generate(
        [TokensPrompt(prompt_token_ids=encoder),
         ExplicitEncoderDecoderPrompt(encoder_prompt=TokensPrompt(prompt_token_ids=encoder),
                                      decoder_prompt=TokensPrompt(prompt_token_ids=[lang]))],
        [SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True, forced_bos_token_id=lang),
         SamplingParams(temperature=0.0, max_tokens=9, ignore_eos=True)], use_tqdm=False)
    assert forced.prompt_token_ids == [2] and forced.outputs[0].token_ids == expected[1:]
    assert prompted.prompt_token_ids == [2, lang] and prompted.outputs[0].token_ids == expected[2:]


# --------------------------------------------------------------------------------------------- beam search
BEAM_VOCAB = 40     # small, so that EOS often ranks among the candidates and ends beams early


@torch.no_grad()
def _hf_best_beam(hf, encoder, decoder_prompt, width, length_penalty, early_stopping):
    out = hf.generate(input_ids=torch.tensor([encoder]), decoder_input_ids=torch.tensor([decoder_prompt]),
                      num_beams=width, do_sample=False, max_new_tokens=NUM_TOKENS, length_penalty=length_penalty,
                      early_stopping=early_stopping, forced_eos_token_id=None, forced_bos_token_id=None,
                      bad_words_ids=None, no_repeat_ngram_size=0, min_length=0, return_dict_in_generate=True,
                      output_scores=True)
    length = int((out.beam_indices[0] != -1).sum())
    start = len(decoder_prompt)
    return out.sequences[0, start:start + length].tolist(), float(out.sequences_scores[0])


@pytest.mark.parametrize("family", ["marian", "m2m100", "pegasus"])
def test_best_beam_matches_hf(family, tmp_path):
    model_dir, hf = save_model(family, str(tmp_path / family), vocab_size=BEAM_VOCAB, eos_likely=True)
    generator = torch.Generator().manual_seed(7)
    start = hf.config.decoder_start_token_id
    encoders = [torch.randint(4, BEAM_VOCAB - 1, (n,), generator=generator).tolist() for n in (6, 21, 3, 14)]
    decoders = [[start], [start, 9], [start], [start, 5, 30]]
    prompts = [ExplicitEncoderDecoderPrompt(encoder_prompt=TokensPrompt(prompt_token_ids=e),
                                            decoder_prompt=TokensPrompt(prompt_token_ids=d))
               for e, d in zip(encoders, decoders)]
    llm = LLM(model_dir, skip_tokenizer_init=True, dtype="float32", block_size=4, kv_cache_space_gb=0.02)
    ended_by_eos = 0
    for width, length_penalty, early_stopping in [(3, 1.0, False), (2, 0.7, True)]:
        params = BeamSearchParams(beam_width=width, max_tokens=NUM_TOKENS, length_penalty=length_penalty,
                                  early_stopping=early_stopping)
        for output, encoder, decoder in zip(llm.beam_search(prompts, params, use_tqdm=False), encoders, decoders):
            tokens, score = _hf_best_beam(hf, encoder, decoder, width, length_penalty, early_stopping)
            assert output.outputs[0].token_ids == tokens, (family, width, encoder)
            assert output.outputs[0].beam_score == pytest.approx(score, abs=1e-4)
            ended_by_eos += len(tokens) < NUM_TOKENS
    print(f"\n{family}: {ended_by_eos} of 8 best beams ended by EOS")
    assert ended_by_eos > 0, "no best beam ended with EOS: the finished-hypothesis rules went untested"


@pytest.mark.parametrize("family", ["marian", "m2m100", "pegasus"])
def test_the_last_table_position_is_used_and_longer_prompts_are_refused(family, tmp_path):
    """max_position_embeddings (64) sizes the tables: a 64-token encoder prompt and a decoder reaching position 63
    match HF; one token more on either side is refused before it reaches the model."""
    model_dir, hf = save_model(family, str(tmp_path / family))
    limit = hf.config.max_position_embeddings
    encoder = torch.randint(4, hf.config.vocab_size - 1, (limit,), generator=torch.Generator().manual_seed(9)).tolist()
    start = hf.config.decoder_start_token_id
    llm = LLM(model_dir, skip_tokenizer_init=True, dtype="float32", block_size=4, kv_cache_space_gb=0.05)
    params = SamplingParams(temperature=0.0, max_tokens=limit - 1, ignore_eos=True, logprobs=0)
    output = llm.generate(TokensPrompt(prompt_token_ids=encoder), params, use_tqdm=False)[0].outputs[0]
    ref_tokens, ref_logprobs = hf_greedy(hf, torch.tensor(encoder), [start], limit - 1)
    assert output.token_ids == ref_tokens
    torch.testing.assert_close(torch.tensor([lp[t] for lp, t in zip(output.logprobs, output.token_ids)]),
                               torch.tensor(ref_logprobs), rtol=0, atol=1e-4)
    with pytest.raises(ValueError, match=f"encoder_prompt has {limit + 1} tokens, longer than max_source_positions "
                                         f"\\({limit}\\)"):
        llm.generate(TokensPrompt(prompt_token_ids=encoder + [5]), params, use_tqdm=False)
    with pytest.raises(ValueError, match=f"decoder prompt length \\(1\\) \\+ max_tokens \\({limit}\\)"):
        llm.generate(TokensPrompt(prompt_token_ids=encoder), SamplingParams(max_tokens=limit), use_tqdm=False)
