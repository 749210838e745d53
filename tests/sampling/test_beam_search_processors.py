"""Logits processors and stop strings in beam search against HF `generate(num_beams=...)` on random tiny BART and
Llama: seven configurations (widths 2/4, length penalties 0.8/1.5/2.0, no_repeat_ngram_size=3, min_tokens, and one
each with repetition_penalty, forced BOS, forced EOS, bad words, suppressed tokens, a per-beam callable) x 8
mixed-length prompts in one batched engine run, every returned beam compared; stop strings and text bad words with a
real tokenizer; request-time errors. EOS is made likely so that finished hypotheses and min_tokens matter."""
import collections
import dataclasses

import pytest
import torch
from generate_reference import EOS, bart_requests, hf_beam_generate, llama_requests, make_eos_likely
from hf_reference import build_tiny_model
from transformers import LogitsProcessor, LogitsProcessorList, StoppingCriteria, StoppingCriteriaList

from seq2seq_engine import LLM, BeamSearchParams, SamplingParams, TokensPrompt
from seq2seq_engine.sampling.logits_processors import tokenize_bad_words
from seq2seq_engine.sampling_params import LOGITS_PROCESSOR_FIELDS

NUM_TOKENS = 20


def _history_bias(output_token_ids, row):
    """A per-beam callable: +3 on a token picked by the beam's own outputs (so each beam's history matters)."""
    bias = torch.zeros_like(row)
    bias[(7 * sum(output_token_ids) + len(output_token_ids)) % row.shape[0]] = 3.0
    return row + bias


class _PerRowProcessor(LogitsProcessor):
    """The same callable in HF: applied to each row with that row's generated tokens."""

    def __init__(self, fn, prompt_len):
        self.fn, self.prompt_len = fn, prompt_len

    def __call__(self, input_ids, scores):
        for i in range(scores.shape[0]):
            scores[i] = self.fn(input_ids[i, self.prompt_len:].tolist(), scores[i])
        return scores


def _configs(f):
    """(name, BeamSearchParams kwargs); `f`: the tokens the unconstrained beams emit most, to ban or force."""
    ngram = dict(no_repeat_ngram_size=3)
    return [
        ("ngram_min_tokens", dict(beam_width=2, length_penalty=0.8, min_tokens=4, **ngram)),
        ("repetition_penalty", dict(beam_width=4, length_penalty=2.0, min_tokens=2, repetition_penalty=1.3, **ngram)),
        ("forced_bos", dict(beam_width=2, length_penalty=2.0, early_stopping=True, min_tokens=3,
                            forced_bos_token_id=f[0], **ngram)),
        # Short, so that beams reach the last step, where the forced token is the only one left.
        ("forced_eos", dict(beam_width=4, length_penalty=0.8, early_stopping="never", max_tokens=8,
                            forced_eos_token_id=f[1], **ngram)),
        ("bad_words", dict(beam_width=4, length_penalty=2.0, min_tokens=5,
                           bad_words_ids=[[f[0]], [f[1], f[2]], [f[3], f[3], f[2]]])),
        ("suppress", dict(beam_width=2, length_penalty=0.8, min_tokens=1, suppress_tokens=[f[1]],
                          begin_suppress_tokens=[f[2], f[4]], **ngram)),
        ("callable", dict(beam_width=4, length_penalty=1.5, logits_processors=[_history_bias])),
    ]


def _hf_kwargs(ours, prompt_len):
    """HF generate kwargs for our BeamSearchParams kwargs: HF's min_length counts the decoder prompt."""
    width = ours["beam_width"]
    hf = dict(num_beams=width, num_return_sequences=width, max_new_tokens=ours.get("max_tokens", NUM_TOKENS),
              forced_eos_token_id=None, min_length=prompt_len + ours.get("min_tokens", 0))
    hf.update({k: v for k, v in ours.items()
               if k not in ("beam_width", "max_tokens", "min_tokens", "logits_processors")})
    if "logits_processors" in ours:
        hf["logits_processor"] = LogitsProcessorList([_PerRowProcessor(fn, prompt_len)
                                                      for fn in ours["logits_processors"]])
    return hf


def _base(ours):
    """The same search without processors (no min_tokens either): what the processors should change."""
    return {k: v for k, v in ours.items() if k in ("beam_width", "length_penalty", "early_stopping", "max_tokens")}


@pytest.mark.parametrize("arch", ["bart", "llama"])
def test_beam_search_processors_match_hf_generate(arch, tmp_path):
    model_dir, hf_model = build_tiny_model(arch, tmp_path, forced_eos_token_id=None)
    make_eos_likely(arch, hf_model)
    hf_model.save_pretrained(model_dir)
    requests = (bart_requests if arch == "bart" else llama_requests)(hf_model.config, torch.Generator().manual_seed(3))
    unconstrained = {}

    def hf_plain(ours, index):
        key = (tuple(sorted(_base(ours).items())), index)
        if key not in unconstrained:
            _, encoder, decoder = requests[index]
            unconstrained[key] = hf_beam_generate(hf_model, encoder, decoder, **_hf_kwargs(_base(ours), len(decoder)))
        return unconstrained[key]

    counts = collections.Counter(t for i in range(len(requests)) for beam, _ in
                                 hf_plain(dict(beam_width=4, length_penalty=2.0), i) for t in beam if t != EOS)
    frequent = [t for t, _ in counts.most_common(5)]
    prompts, params, expected, changed = [], [], [], collections.Counter()
    for name, ours in _configs(frequent):
        for index, (prompt, encoder, decoder) in enumerate(requests):
            reference = hf_beam_generate(hf_model, encoder, decoder, **_hf_kwargs(ours, len(decoder)))
            prompts.append(prompt)
            params.append(BeamSearchParams(**dict(dict(max_tokens=NUM_TOKENS), **ours)))
            expected.append((name, reference))
            changed[name] += reference[0][0] != hf_plain(ours, index)[0][0]
    llm = LLM(model_dir, skip_tokenizer_init=True, dtype="float32", block_size=4, kv_cache_space_gb=0.05)
    outputs = llm.beam_search(prompts, params, use_tqdm=False)

    best_mismatches, matched_all, total, ended_by_eos = [], 0, 0, 0
    for output, p, (name, reference) in zip(outputs, params, expected):
        ours = output.outputs
        assert output.finished and len(ours) == p.beam_width == len(reference)
        if ours[0].token_ids != reference[0][0] or ours[0].beam_score != pytest.approx(reference[0][1], abs=1e-4):
            best_mismatches.append((name, ours[0].token_ids, ours[0].beam_score, reference[0]))
        assert all(len(c.token_ids) > p.min_tokens for c in ours)
        matched_all += sum(c.token_ids == tokens for c, (tokens, _) in zip(ours, reference))
        total += len(ours)
        ended_by_eos += sum(c.token_ids[-1] == EOS and len(c.token_ids) < p.max_tokens for c in ours)
    print(f"\n{arch}: best beams identical {len(outputs) - len(best_mismatches)}/{len(outputs)}, all beams identical "
          f"{matched_all}/{total}, beams ended by EOS {ended_by_eos}, best changed by the processors {dict(changed)}")
    assert not best_mismatches
    assert matched_all >= 0.9 * total
    assert ended_by_eos >= 10, "EOS rarely ended a beam: finished hypotheses and min_tokens went untested"
    # Each configuration changed the best beam of several prompts (forced BOS only applies to 1-token decoder
    # prompts): the processors were at work, this is not a comparison of plain beam searches.
    assert all(changed[name] >= 2 for name, _ in _configs(frequent)), changed


class _TextStop(StoppingCriteria):
    """A candidate stops when its generated text contains a stop string (vLLM's rule, as a HF criterion)."""

    def __init__(self, tokenizer, prompt_len, stops):
        self.tokenizer, self.prompt_len, self.stops = tokenizer, prompt_len, stops

    def __call__(self, input_ids, scores, **kwargs):
        texts = [self.tokenizer.decode(row[self.prompt_len:].tolist(), skip_special_tokens=True) for row in input_ids]
        return torch.tensor([any(s in text for s in self.stops) for text in texts])


def test_stop_strings_and_bad_words_in_beam_search_match_hf(bart_with_tokenizer):
    model_dir, hf_model, tokenizer = bart_with_tokenizer
    texts = ["the quick brown fox jumps over the lazy dog", "hello world", "encoder decoder audio speech",
             "lazy dog over the fox"]
    width, decoder_prompt = 3, [2, 0]
    prompts, params, references = [], [], []
    for text in texts:
        encoder = tokenizer(text).input_ids
        free = hf_beam_generate(hf_model, encoder, decoder_prompt, num_beams=width, num_return_sequences=width,
                                max_new_tokens=12, forced_eos_token_id=None)
        free_text = tokenizer.decode(free[0][0], skip_special_tokens=True)
        stop = free_text[len(free_text) // 2:len(free_text) // 2 + 2]
        word = max(free_text.split(), key=len)
        assert stop.strip() and word
        for ours, hf in [(dict(stop=[stop]), dict(stopping_criteria=StoppingCriteriaList(
                                                      [_TextStop(tokenizer, len(decoder_prompt), [stop])]))),
                         (dict(bad_words=[word]), dict(bad_words_ids=tokenize_bad_words([word], tokenizer)))]:
            prompts.append(text)
            params.append(BeamSearchParams(beam_width=width, max_tokens=12, **ours))
            references.append(hf_beam_generate(hf_model, encoder, decoder_prompt, num_beams=width,
                                               num_return_sequences=width, max_new_tokens=12,
                                               forced_eos_token_id=None, **hf))
    llm = LLM(model_dir, block_size=4, kv_cache_space_gb=0.01)
    outputs = llm.beam_search(prompts, params, use_tqdm=False)
    stopped_by_text = 0
    for output, p, reference in zip(outputs, params, references):
        assert [c.token_ids for c in output.outputs] == [tokens for tokens, _ in reference]
        for completion in output.outputs:
            full_text = tokenizer.decode(completion.token_ids, skip_special_tokens=True)
            if p.stop and p.stop[0] in full_text:
                stopped_by_text += 1
                assert (completion.finish_reason, completion.stop_reason) == ("stop", p.stop[0])
                assert completion.text == full_text[:full_text.index(p.stop[0])]
            if p.bad_words:
                assert p.bad_words[0] not in full_text.split()
    print(f"\nstop strings: {stopped_by_text} of {len(texts) * width} beams ended by one")
    assert stopped_by_text >= len(texts)


@pytest.fixture(scope="module")
def llama_llm(tmp_path_factory):
    model_dir, _ = build_tiny_model("llama", tmp_path_factory.mktemp("llama"))
    return LLM(model_dir, skip_tokenizer_init=True, dtype="float32", block_size=4, kv_cache_space_gb=0.01)


def test_beam_params_share_sampling_params_fields_and_checks(llama_llm):
    sampling_fields = {f.name: f for f in dataclasses.fields(SamplingParams)}
    beam_fields = {f.name: f for f in dataclasses.fields(BeamSearchParams)}
    for name in LOGITS_PROCESSOR_FIELDS + ("stop", "min_tokens", "stop_token_ids"):
        assert beam_fields[name].default == sampling_fields[name].default, name
    params = BeamSearchParams(beam_width=2, max_tokens=4, stop="ab", suppress_tokens=(5, 6), bad_words_ids=[(7, 8)])
    assert params.stop == ["ab"] and params.suppress_tokens == [5, 6] and params.bad_words_ids == [[7, 8]]
    sampling = params.to_sampling_params()
    assert all(getattr(sampling, name) == getattr(params, name) for name in LOGITS_PROCESSOR_FIELDS)
    for kwargs, message in [(dict(repetition_penalty=0.0), r"repetition_penalty must be in \[1e-06, inf\]"),
                            (dict(no_repeat_ngram_size=-1), "no_repeat_ngram_size must be >= 0"),
                            (dict(allowed_token_ids=[]), "allowed_token_ids must not be empty"),
                            (dict(bad_words_ids=[[]]), "bad_words_ids must be a list of non-empty lists"),
                            (dict(stop=[""]), "stop must hold non-empty strings"),
                            (dict(presence_penalty=3.0), r"presence_penalty must be in \[-2.0, 2.0\]"),
                            (dict(forced_bos_token_id=9, allowed_token_ids=[1]), "is not in allowed_token_ids")]:
        with pytest.raises(ValueError, match=message):
            BeamSearchParams(beam_width=2, max_tokens=4, **kwargs)
    prompts = [TokensPrompt(prompt_token_ids=[5, 6, 7]), TokensPrompt(prompt_token_ids=[8])]
    ok = BeamSearchParams(beam_width=2, max_tokens=4)
    for kwargs, message in [(dict(suppress_tokens=[256]), "suppress_tokens holds token id 256, outside"),
                            (dict(bad_words_ids=[[3, 300]]), "bad_words_ids holds token id 300"),
                            (dict(bad_words=["dog"]), "bad_words need a tokenizer"),
                            (dict(stop=["dog"]), "stop strings need a tokenizer")]:
        with pytest.raises(ValueError, match=message):
            llama_llm.beam_search(prompts, [ok, BeamSearchParams(beam_width=2, max_tokens=4, **kwargs)],
                                  use_tqdm=False)
        assert not llama_llm.llm_engine.has_unfinished_requests()
