"""End-to-end greedy parity of the logits processors with HF `generate(do_sample=False)` on random tiny BART
(encoder/decoder) and Llama (decoder-only): four settings x eight prompts, all in one mixed engine batch, identical
tokens. EOS is made likely (a logit bias baked into the weights) so that min_tokens and stopping matter."""
import collections

import pytest
import torch
from generate_reference import EOS, bart_requests, hf_greedy_generate, llama_requests, make_eos_likely
from hf_reference import build_tiny_model

from seq2seq_engine import LLM, SamplingParams

SETTINGS = ["ngram_repetition", "min_bad_suppress", "forced", "everything"]


def _settings(name, prompt_len, frequent):
    """(our SamplingParams kwargs, HF generate kwargs) for one named setting. HF's min_length counts the decoder
    prompt, our min_tokens only the outputs; `frequent` are tokens the unconstrained model emits most."""
    ngram_repetition = dict(no_repeat_ngram_size=3, repetition_penalty=1.3)
    bans = dict(bad_words_ids=[[frequent[0]], [frequent[2], frequent[2]], [frequent[3], frequent[3], frequent[3]]],
                suppress_tokens=[frequent[1]], begin_suppress_tokens=[frequent[4], frequent[5]])
    forced = dict(forced_bos_token_id=frequent[1], forced_eos_token_id=frequent[7])
    ours = {"ngram_repetition": dict(ngram_repetition, max_tokens=24),
            "min_bad_suppress": dict(bans, min_tokens=10, max_tokens=20),
            "forced": dict(forced, max_tokens=12),
            "everything": dict(ngram_repetition, **bans, min_tokens=6, forced_bos_token_id=frequent[0],
                               forced_eos_token_id=EOS, max_tokens=16)}[name]
    hf = {k: v for k, v in ours.items() if k not in ("max_tokens", "min_tokens")}
    hf["max_new_tokens"] = ours["max_tokens"]
    if "min_tokens" in ours:
        hf["min_length"] = prompt_len + ours["min_tokens"]
    return ours, hf


@pytest.mark.parametrize("arch", ["bart", "llama"])
def test_greedy_processors_match_hf_generate(arch, tmp_path):
    model_dir, hf_model = build_tiny_model(arch, tmp_path, forced_eos_token_id=None)
    make_eos_likely(arch, hf_model)
    hf_model.save_pretrained(model_dir)
    make_requests = bart_requests if arch == "bart" else llama_requests
    requests = make_requests(hf_model.config, torch.Generator().manual_seed(7))
    plain = [hf_greedy_generate(hf_model, enc, dec, max_new_tokens=24) for _, enc, dec in requests]
    # Tokens to ban or force: the commonest of the plain runs, then of runs kept diverse by a repetition penalty.
    diverse = [hf_greedy_generate(hf_model, enc, dec, max_new_tokens=12, repetition_penalty=2.0)
               for _, enc, dec in requests]
    frequent = [t for out in (plain, diverse) for t, _ in collections.Counter(
        t for tokens in out for t in tokens if t != EOS).most_common()]
    frequent = list(dict.fromkeys(frequent))[:8]
    assert len(frequent) == 8

    prompts, params, expected, changed = [], [], [], collections.Counter()
    for name in SETTINGS:
        for (prompt, encoder, decoder), unconstrained in zip(requests, plain):
            ours, hf = _settings(name, len(decoder), frequent)
            reference = hf_greedy_generate(hf_model, encoder, decoder, **hf)
            prompts.append(prompt)
            params.append(SamplingParams(temperature=0.0, **ours))
            expected.append(reference)
            changed[name] += reference != unconstrained[:len(reference)]
    llm = LLM(model_dir, skip_tokenizer_init=True, dtype="float32", block_size=4, kv_cache_space_gb=0.05)
    outputs = llm.generate(prompts, params, use_tqdm=False)
    mismatches = [(i, o.outputs[0].token_ids, e) for i, (o, e) in enumerate(zip(outputs, expected))
                  if o.outputs[0].token_ids != e]
    assert not mismatches
    # Every setting changed several outputs (forced BOS only applies to the 1-token prompts), so this is not a
    # comparison of plain greedy runs.
    assert all(changed[name] >= 3 for name in SETTINGS) and sum(changed.values()) >= 20, changed
    assert any(len(e) < p.max_tokens for e, p in zip(expected, params))  # some stop at EOS after min_tokens
