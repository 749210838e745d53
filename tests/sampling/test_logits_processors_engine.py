"""Logits processors through the engine: OpenAI-style options against a plain-torch greedy reference over HF
forwards, sampled tokens that never leave allowed_token_ids or hit a bad word, text bad_words with a real
tokenizer, and request-time errors (vocab limits, bad_words without a tokenizer)."""
import pytest
import torch
import transformers
from hf_reference import build_tiny_model

from seq2seq_engine import LLM, SamplingParams, TokensPrompt
from seq2seq_engine.sampling.logits_processors import tokenize_bad_words

EOS = 2


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    model_dir, hf_model = build_tiny_model("llama", tmp_path_factory.mktemp("llama_procs"))
    llm = LLM(model_dir, skip_tokenizer_init=True, dtype="float32", block_size=4, kv_cache_space_gb=0.02, seed=0)
    return llm, hf_model


def _plain_torch_process(logits, output, params):
    """presence / frequency (OpenAI: subtracted), logit_bias (added), allowed_token_ids (the rest -inf)."""
    logits = logits.clone()
    counts = torch.bincount(torch.tensor(output, dtype=torch.long), minlength=logits.shape[0]).float()
    logits -= params.frequency_penalty * counts + params.presence_penalty * (counts > 0).float()
    for token, bias in (params.logit_bias or {}).items():
        logits[token] += bias
    if params.allowed_token_ids is not None:
        keep = torch.full_like(logits, float("-inf"))
        keep[params.allowed_token_ids] = 0.0
        logits += keep
    return logits


@torch.no_grad()
def _reference_greedy(hf_model, prompt, params):
    output = []
    for _ in range(params.max_tokens):
        logits = hf_model(input_ids=torch.tensor([prompt + output])).logits[0, -1].float()
        output.append(int(_plain_torch_process(logits, output, params).argmax()))
    return output


def test_openai_style_options_match_plain_torch_reference(llama):
    llm, hf_model = llama
    generator = torch.Generator().manual_seed(11)
    prompts = [torch.randint(4, 256, (n,), generator=generator).tolist() for n in (3, 8, 1, 15, 5, 11)]
    settings = [dict(presence_penalty=1.5), dict(frequency_penalty=0.7), dict(presence_penalty=-0.5,
                                                                              frequency_penalty=1.2),
                dict(logit_bias={17: 4.0, 99: 6.5, 5: -30.0}), dict(allowed_token_ids=[7, 30, 31, 200, 255]),
                dict(frequency_penalty=2.0, logit_bias={40: 3.0}, allowed_token_ids=list(range(30, 60)))]
    params = [SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True, **s) for s in settings]
    outputs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
    plain = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts],
                         SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True), use_tqdm=False)
    for prompt, p, out, unconstrained in zip(prompts, params, outputs, plain):
        assert out.outputs[0].token_ids == _reference_greedy(hf_model, prompt, p)
        assert out.outputs[0].token_ids != unconstrained.outputs[0].token_ids


@pytest.mark.parametrize("filters", [dict(), dict(top_k=20), dict(top_p=0.9, min_p=0.01)])
def test_sampled_tokens_stay_in_allowed_set_and_avoid_bad_words(llama, filters):
    llm, _ = llama
    generator = torch.Generator().manual_seed(5)
    prompts = [TokensPrompt(prompt_token_ids=torch.randint(4, 256, (n,), generator=generator).tolist())
               for n in (2, 9, 4, 13)]
    free = llm.generate(prompts, SamplingParams(temperature=1.0, seed=1, max_tokens=48, ignore_eos=True, **filters),
                        use_tqdm=False)
    # Ban the tokens (and a bigram) that the unconstrained runs sample most.
    counts = torch.bincount(torch.tensor([t for o in free for t in o.outputs[0].token_ids]), minlength=256)
    top = counts.argsort(descending=True)[:6].tolist()
    bigram = free[0].outputs[0].token_ids[3:5]
    allowed = sorted(set(range(0, 256, 7)) | {top[0]})
    bad = SamplingParams(temperature=1.0, seed=2, max_tokens=48, ignore_eos=True, bad_words_ids=[[t] for t in top]
                         + [bigram], **filters)
    only = SamplingParams(temperature=1.0, seed=3, max_tokens=48, ignore_eos=True, allowed_token_ids=allowed,
                          **filters)
    outputs = llm.generate(prompts * 2, [bad] * 4 + [only] * 4, use_tqdm=False)
    for prompt, out in zip(prompts, outputs[:4]):
        tokens = out.outputs[0].token_ids
        assert not set(tokens) & set(top)
        history = prompt["prompt_token_ids"] + tokens
        assert all(history[i:i + 2] != bigram for i in range(len(prompt["prompt_token_ids"]) - 1, len(history) - 1))
    sampled = {t for out in outputs[4:] for t in out.outputs[0].token_ids}
    assert sampled <= set(allowed) and len(sampled) > 3


class _FakeTokenizer:
    """encode() from a fixed table: what vLLM's rule keeps depends only on these token sequences."""
    table = {"foo": [5, 6], " foo": [7, 6], "bar": [8, 9], " bar": [10], "baz": [11], " baz": [11]}

    def encode(self, text, add_special_tokens=True):
        assert not add_special_tokens
        return self.table[text]


def test_bad_words_tokenized_with_and_without_leading_space():
    # " foo": a different first token, same length -> kept; " bar": another length -> dropped; " baz": the same.
    assert tokenize_bad_words(["foo", " bar", "baz"], _FakeTokenizer()) == [[5, 6], [7, 6], [8, 9], [11]]


def test_text_bad_words_with_a_real_tokenizer(tmp_path, spm_bart_tokenizer):
    model_dir, _ = build_tiny_model("bart", tmp_path, vocab_size=len(spm_bart_tokenizer))
    spm_bart_tokenizer.save_pretrained(model_dir)
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    llm = LLM(model_dir, kv_cache_space_gb=0.02, block_size=8)
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    free = llm.generate("the quick brown fox", params, use_tqdm=False)[0].outputs[0]
    word = tokenizer.convert_tokens_to_string([tokenizer.convert_ids_to_tokens(free.token_ids[2])]).strip()
    banned_ids = tokenizer.encode(word, add_special_tokens=False)
    assert len(banned_ids) == 1
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True, bad_words=[word])
    out = llm.generate("the quick brown fox", params, use_tqdm=False)[0].outputs[0]
    assert banned_ids[0] in free.token_ids and banned_ids[0] not in out.token_ids


@pytest.mark.parametrize("field,value", [
    ("forced_bos_token_id", 256), ("forced_eos_token_id", 300), ("suppress_tokens", [3, 256]),
    ("begin_suppress_tokens", [1000]), ("logit_bias", {256: 1.0}), ("allowed_token_ids", [0, 999]),
    ("bad_words_ids", [[5, 6], [7, 256]])])
def test_token_ids_outside_the_vocabulary_are_refused_at_request_time(llama, field, value):
    llm, _ = llama
    with pytest.raises(ValueError, match=rf"^{field} holds token id \d+, outside .* \[0, 256\)"):
        llm.generate(TokensPrompt(prompt_token_ids=[5, 6]), SamplingParams(max_tokens=2, **{field: value}),
                     use_tqdm=False)
    assert not llm.llm_engine.has_unfinished_requests()


def test_bad_words_need_a_tokenizer(llama):
    llm, _ = llama
    with pytest.raises(ValueError, match="bad_words need a tokenizer.*bad_words_ids"):
        llm.generate(TokensPrompt(prompt_token_ids=[5, 6]), SamplingParams(bad_words=["x"]), use_tqdm=False)


def test_penalties_are_accepted_by_the_engine(llama):
    llm, _ = llama
    out = llm.generate(TokensPrompt(prompt_token_ids=[5, 6, 5, 6]), SamplingParams(
        temperature=0.0, max_tokens=4, repetition_penalty=1.2, presence_penalty=0.5, frequency_penalty=0.5),
        use_tqdm=False)[0]
    assert len(out.outputs[0].token_ids) == 4
