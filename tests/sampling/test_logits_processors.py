"""LogitsProcessorBatch against HF transformers' own LogitsProcessor classes (and plain torch for the OpenAI-style
options): random logits, random token histories with many repeats, several rows with different settings in one
batch plus rows with no processor, compared row by row with HF run on that row alone."""
import random

import pytest
import torch
from transformers.generation import logits_process as hf

from seq2seq_engine import SamplingParams
from seq2seq_engine.sampling.logits_processors import LogitsProcessorBatch, TokenHistories

VOCAB = 40
EOS = 2
NUM_ROWS = 24


def _history(rng):
    """A decoder prompt (length 1..4) and outputs (0..18) drawn from few ids, so that n-grams repeat."""
    alphabet = [EOS, 5, 6, 7, 8] if rng.random() < 0.5 else list(range(3, 12))
    prompt = [rng.choice(alphabet) for _ in range(rng.randint(1, 4))]
    return prompt, [rng.choice(alphabet) for _ in range(rng.randint(0, 18))]


def _repetition(rng, prompt, output):
    penalty = rng.choice([0.5, 1.3, 2.0])
    return dict(repetition_penalty=penalty), [hf.RepetitionPenaltyLogitsProcessor(penalty)]


def _ngram(rng, prompt, output):
    size = rng.randint(1, 4)
    return dict(no_repeat_ngram_size=size), [hf.NoRepeatNGramLogitsProcessor(size)]


def _bad_words(rng, prompt, output):
    words = [[rng.randint(3, 11) for _ in range(rng.randint(1, 3))] for _ in range(rng.randint(1, 4))]
    if rng.random() < 0.3:
        words.append([EOS])            # dropped, as HF does
    return dict(bad_words_ids=words), [hf.NoBadWordsLogitsProcessor(words, EOS)]


def _min_tokens(rng, prompt, output):
    min_tokens, stop_ids = rng.randint(0, 12), rng.sample(range(3, 12), rng.randint(0, 2))
    return (dict(min_tokens=min_tokens, stop_token_ids=stop_ids, max_tokens=None),
            [hf.MinLengthLogitsProcessor(len(prompt) + min_tokens, [EOS] + stop_ids)])


def _forced_bos(rng, prompt, output):
    del prompt[1:], output[:]          # forced only when the decoder sequence has length 1
    token = rng.randint(0, VOCAB - 1)
    return dict(forced_bos_token_id=token), [hf.ForcedBOSTokenLogitsProcessor(token)]


def _forced_eos(rng, prompt, output):
    token, max_tokens = rng.randint(0, VOCAB - 1), len(output) + rng.choice([1, 2])
    return (dict(forced_eos_token_id=token, max_tokens=max_tokens),
            [hf.ForcedEOSTokenLogitsProcessor(len(prompt) + max_tokens, token)])


def _suppress(rng, prompt, output):
    tokens = rng.sample(range(VOCAB), rng.randint(1, 6))
    return dict(suppress_tokens=tokens), [hf.SuppressTokensLogitsProcessor(tokens)]


def _begin_suppress(rng, prompt, output):
    if rng.random() < 0.5:
        del output[rng.randint(0, 1):]
    tokens = rng.sample(range(VOCAB), rng.randint(1, 6))
    return dict(begin_suppress_tokens=tokens), [hf.SuppressTokensAtBeginLogitsProcessor(tokens, len(prompt))]


def _begin_suppress_after_forced_bos(rng, prompt, output):
    """HF: with a forced BOS and a 1-token prompt, the 'beginning' is the token after the forced one."""
    del prompt[1:], output[rng.randint(0, 2):]
    bos, tokens = rng.randint(0, VOCAB - 1), rng.sample(range(VOCAB), 4)
    return (dict(forced_bos_token_id=bos, begin_suppress_tokens=tokens),
            [hf.ForcedBOSTokenLogitsProcessor(bos), hf.SuppressTokensAtBeginLogitsProcessor(tokens, 2)])


CASES = {f.__name__.strip("_"): f for f in (_repetition, _ngram, _bad_words, _min_tokens, _forced_bos, _forced_eos,
                                            _suppress, _begin_suppress, _begin_suppress_after_forced_bos)}


def _run_batch(param_list, histories, logits, max_model_len=None):
    batch = LogitsProcessorBatch.build(param_list, TokenHistories.from_lists(*zip(*histories)), EOS, max_model_len)
    return logits.clone() if batch is None else batch(logits.clone())


def _hf_row(processors, prompt, output, row):
    input_ids, scores = torch.tensor([prompt + output]), row.unsqueeze(0).clone()
    for processor in processors:
        scores = processor(input_ids, scores)
    return scores[0]


def _check_batch(rng, make_row):
    """Rows 0, 3, 6, ... have no processor; the others get make_row's settings. Every row must equal HF's."""
    logits = torch.randn(NUM_ROWS, VOCAB, generator=torch.Generator().manual_seed(rng.randint(0, 10**6))) * 3
    param_list, histories, references = [], [], []
    for i in range(NUM_ROWS):
        prompt, output = _history(rng)
        kwargs, processors = make_row(rng, prompt, output) if i % 3 else ({}, [])
        param_list.append(SamplingParams(**{"max_tokens": 64, **kwargs}))
        histories.append((prompt, output))
        references.append(_hf_row(processors, prompt, output, logits[i]))
    ours = _run_batch(param_list, histories, logits)
    torch.testing.assert_close(ours, torch.stack(references), rtol=0, atol=0)
    return ours, logits


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("seed", range(4))
def test_each_processor_matches_hf(case, seed):
    ours, logits = _check_batch(random.Random(f"{case}{seed}"), CASES[case])
    assert not torch.equal(ours, logits)          # the settings did something in this batch


def _combined(rng, prompt, output):
    """A random subset of the processors, in HF's `_get_logits_processor` order. min_tokens and a forced EOS are not
    combined: where they meet, the min_tokens ban wins by design (test_forced_token_never_lifts_...)."""
    kwargs, processors = {}, []
    names = ["repetition", "ngram", "bad_words", rng.choice(["min_tokens", "forced_eos"]), "suppress",
             "begin_suppress"]
    # begin_suppress shortens the history, so it goes first: forced EOS's max_tokens is set from the final one.
    for name in sorted(rng.sample(names, rng.randint(2, len(names))), key=lambda n: n != "begin_suppress"):
        part_kwargs, part = CASES[name](rng, prompt, output)
        kwargs.update(part_kwargs)
        processors += part
    order = [hf.RepetitionPenaltyLogitsProcessor, hf.NoRepeatNGramLogitsProcessor, hf.NoBadWordsLogitsProcessor,
             hf.MinLengthLogitsProcessor, hf.ForcedEOSTokenLogitsProcessor, hf.SuppressTokensLogitsProcessor,
             hf.SuppressTokensAtBeginLogitsProcessor]
    return kwargs, sorted(processors, key=lambda p: order.index(type(p)))


@pytest.mark.parametrize("seed", range(12))
def test_combined_processors_match_hf_in_hf_order(seed):
    _check_batch(random.Random(seed), _combined)


def test_rows_sharing_one_params_object_match_hf():
    """Rows of one generate() call share their SamplingParams object (the processors group rows by it)."""
    rng = random.Random(99)
    shared = SamplingParams(repetition_penalty=1.3, no_repeat_ngram_size=2,
                            bad_words_ids=[[5], [6, 7], [7, 6], [8, 6], [8, 8, 9], [7, 7, 8]], suppress_tokens=[10],
                            begin_suppress_tokens=[11, 3], min_tokens=6, stop_token_ids=[4], max_tokens=10,
                            forced_eos_token_id=3)
    other = SamplingParams(no_repeat_ngram_size=3, suppress_tokens=[5, 6])
    param_list = [shared if i % 3 else other for i in range(NUM_ROWS)]
    histories = [_history(rng) for _ in range(NUM_ROWS)]
    for prompt, output in histories[::4]:
        del output[rng.randint(0, 1):]
    for prompt, output in histories[1::5]:
        del output[9:]
    logits = torch.randn(NUM_ROWS, VOCAB, generator=torch.Generator().manual_seed(3)) * 3
    references = []
    for params, (prompt, output), row in zip(param_list, histories, logits):
        processors = [hf.NoRepeatNGramLogitsProcessor(3), hf.SuppressTokensLogitsProcessor([5, 6])]
        if params is shared:
            processors = [hf.RepetitionPenaltyLogitsProcessor(1.3), hf.NoRepeatNGramLogitsProcessor(2),
                          hf.NoBadWordsLogitsProcessor(shared.bad_words_ids, EOS),
                          hf.MinLengthLogitsProcessor(len(prompt) + 6, [EOS, 4]),
                          hf.ForcedEOSTokenLogitsProcessor(len(prompt) + 10, 3),
                          hf.SuppressTokensLogitsProcessor([10]),
                          hf.SuppressTokensAtBeginLogitsProcessor([11, 3], len(prompt))]
        references.append(_hf_row(processors, prompt, output, row))
    ours = _run_batch(param_list, histories, logits)
    torch.testing.assert_close(ours, torch.stack(references), rtol=0, atol=0)
    assert any(len(o) == 9 for _, o in histories[1::3])       # some shared row is forced


def test_forced_eos_at_the_model_length():
    histories = [([4, 5], [6, 7, 8]), ([4, 5], [6, 7]), ([4], [])]
    params = [SamplingParams(forced_eos_token_id=9, max_tokens=None)] * 3
    logits = torch.randn(3, VOCAB)
    ours = _run_batch(params, histories, logits, max_model_len=6)
    hf_eos = hf.ForcedEOSTokenLogitsProcessor(6, 9)
    torch.testing.assert_close(ours, torch.stack([_hf_row([hf_eos], p, o, r) for (p, o), r in zip(histories, logits)]))
    assert torch.isinf(ours[0]).sum() == VOCAB - 1 and torch.equal(ours[1:], logits[1:])


def test_forced_token_never_lifts_the_min_tokens_ban():
    """min_tokens == max_tokens: the last token cannot be the forced EOS, so that row is not forced at all."""
    params = [SamplingParams(forced_eos_token_id=EOS, max_tokens=3, min_tokens=3),
              SamplingParams(forced_eos_token_id=7, max_tokens=3, min_tokens=3)]
    logits = torch.randn(2, VOCAB)
    ours = _run_batch(params, [([1], [4, 5]), ([1], [4, 5])], logits)
    expected = logits.clone()
    expected[0, EOS] = float("-inf")
    assert torch.equal(ours[0], expected[0])
    assert ours[1].argmax() == 7 and torch.isinf(ours[1]).sum() == VOCAB - 1


def _plain_torch_reference(logits, output, params):
    """OpenAI / vLLM semantics written out directly."""
    logits = logits.clone()
    counts = torch.bincount(torch.tensor(output, dtype=torch.long), minlength=VOCAB).float()
    logits -= params.frequency_penalty * counts + params.presence_penalty * (counts > 0).float()
    for token, bias in (params.logit_bias or {}).items():
        logits[token] += bias
    if params.allowed_token_ids is not None:
        mask = torch.full((VOCAB,), float("-inf"))
        mask[params.allowed_token_ids] = 0.0
        logits += mask
    return logits


@pytest.mark.parametrize("seed", range(6))
def test_presence_frequency_logit_bias_allowed_match_plain_torch(seed):
    rng = random.Random(seed)
    logits = torch.randn(NUM_ROWS, VOCAB, generator=torch.Generator().manual_seed(seed)) * 3
    param_list, histories = [], []
    for i in range(NUM_ROWS):
        kwargs = {}
        if i % 4:
            kwargs = dict(presence_penalty=rng.uniform(-2, 2), frequency_penalty=rng.uniform(-2, 2))
        if i % 3 == 1:
            kwargs["logit_bias"] = {t: rng.uniform(-20, 20) for t in rng.sample(range(VOCAB), 5)}
        if i % 5 == 2:
            kwargs["allowed_token_ids"] = rng.sample(range(VOCAB), rng.randint(1, 8))
        param_list.append(SamplingParams(**kwargs))
        histories.append(_history(rng))
    ours = _run_batch(param_list, histories, logits)
    expected = torch.stack([_plain_torch_reference(logits[i], histories[i][1], param_list[i])
                            for i in range(NUM_ROWS)])
    torch.testing.assert_close(ours, expected, rtol=1e-6, atol=1e-5)


def test_nothing_is_built_without_processors():
    params = [SamplingParams(), SamplingParams(temperature=0.0, min_tokens=2)]
    histories = TokenHistories.from_lists([[1, 2], [3]], [[4], [5, 6]])
    assert LogitsProcessorBatch.build(params, histories, EOS, None) is None
    # min_tokens still active for a row below it:
    histories = TokenHistories.from_lists([[1, 2], [3]], [[4], [5]])
    assert LogitsProcessorBatch.build(params, histories, EOS, None) is not None


def test_user_callables_run_after_builtins_and_before_the_min_tokens_ban():
    seen = []

    def lift_everything(output_ids, row):
        seen.append((list(output_ids), torch.isinf(row).nonzero().flatten().tolist()))
        return torch.zeros_like(row)

    params = [SamplingParams(suppress_tokens=[5], min_tokens=3, logits_processors=[lift_everything])]
    ours = _run_batch(params, [([1], [8, 9])], torch.randn(1, VOCAB))
    assert seen == [([8, 9], [5])]
    assert torch.isinf(ours[0]).nonzero().flatten().tolist() == [EOS]


def test_processors_apply_to_any_float_rows_such_as_log_softmax():
    """Beam search hands log-probabilities (all negative): the repetition penalty multiplies them, as HF."""
    logprobs = torch.log_softmax(torch.randn(2, VOCAB), dim=-1)
    params = [SamplingParams(repetition_penalty=1.5, no_repeat_ngram_size=2)] * 2
    histories = [([1, 4, 5], [4]), ([1], [])]
    ours = _run_batch(params, histories, logprobs)
    reference = [hf.RepetitionPenaltyLogitsProcessor(1.5), hf.NoRepeatNGramLogitsProcessor(2)]
    torch.testing.assert_close(ours, torch.stack([_hf_row(reference, p, o, r)
                                                  for (p, o), r in zip(histories, logprobs)]))
    assert ours[0, 5] == float("-inf") and ours[0, 4] == logprobs[0, 4] * 1.5
