"""Sampler and SamplingMetadata: greedy, logprobs, temperature / top-k / top-p / min-p distributions against a
plain sort-based reference, and seeded rows that do not depend on the rest of the batch."""
import math

import pytest
import torch

from seq2seq_engine.sampling.metadata import SamplingMetadata, make_generator
from seq2seq_engine.sampling.sampler import Sampler, SamplerOutput
from seq2seq_engine.sampling_params import SamplingParams


def _sample(logits, params_list, generators=None, sampler=None):
    generators = generators or [None] * len(params_list)
    metadata = SamplingMetadata.build(list(zip(params_list, generators)), "cpu")
    return (sampler or Sampler())(logits, metadata)


def _reference_probs(logits_row, temperature=1.0, top_k=-1, top_p=1.0, min_p=0.0, p_slack=0.0, min_p_slack=0.0):
    """The filtered, renormalised distribution (float64), computed by sorting, one filter after the other.

    p_slack / min_p_slack loosen the cut-offs so the result's support is a superset of the exact one's.
    """
    probs = torch.softmax(logits_row.double() / temperature, dim=-1)
    sorted_probs, order = torch.sort(probs, descending=True)
    keep = torch.ones_like(sorted_probs, dtype=torch.bool)
    if top_k > 0:
        keep[top_k:] = False
    kept = torch.where(keep, sorted_probs, torch.zeros_like(sorted_probs))
    kept = kept / kept.sum()
    if top_p < 1.0:
        mass_before = torch.cumsum(kept, 0) - kept
        keep &= mass_before < top_p + p_slack
        keep[0] = True
    kept = torch.where(keep, sorted_probs, torch.zeros_like(sorted_probs))
    if min_p > 0.0:
        keep &= kept >= (min_p - min_p_slack) * kept.max()
    kept = torch.where(keep, sorted_probs, torch.zeros_like(sorted_probs))
    out = torch.zeros_like(probs)
    out[order] = kept / kept.sum()
    return out


def _chi_square_ok(tokens, expected_probs, num_samples):
    counts = torch.bincount(tokens, minlength=expected_probs.numel()).double()
    expected = expected_probs * num_samples
    big = expected >= 5
    stat = (((counts - expected) ** 2) / expected.clamp_min(1e-12))[big].sum().item()
    df = max(int(big.sum().item()) - 1, 1)
    # A loose bound (far in the tail of chi-square(df)), plus: the rare tokens together are not over-sampled.
    small_ok = counts[~big].sum().item() <= expected[~big].sum().item() + 6 * math.sqrt(expected[~big].sum().item() + 1)
    return stat < df + 8 * math.sqrt(2 * df) + 10, stat, df, small_ok


# ----------------------------------------------------------------------------------------------- greedy
def test_greedy_is_argmax_with_lowest_id_on_ties():
    torch.manual_seed(0)
    logits = torch.randn(8, 300)
    logits[3, [7, 100, 250]] = 50.0  # a tie: the lowest id wins, as with torch.argmax
    logits[5, :] = 1.0               # all tied
    out = _sample(logits, [SamplingParams(temperature=0.0)] * 8)
    assert isinstance(out, SamplerOutput)
    assert out.sampled_token_ids.dtype == torch.int64
    assert torch.equal(out.sampled_token_ids, torch.argmax(logits, dim=-1))
    assert out.sampled_token_ids[3].item() == 7 and out.sampled_token_ids[5].item() == 0
    assert out.topk_logprobs is None and out.topk_token_ids is None


def test_greedy_rows_in_a_mixed_batch_and_temperature_below_eps():
    torch.manual_seed(1)
    logits = torch.randn(6, 120)
    params = [SamplingParams(temperature=0.0), SamplingParams(temperature=1.0), SamplingParams(temperature=1e-6),
              SamplingParams(top_k=3), SamplingParams(temperature=0.0, top_p=0.5, top_k=2),
              SamplingParams(seed=5)]
    out = _sample(logits, params, [None] * 5 + [make_generator(5)])
    greedy = torch.argmax(logits, dim=-1)
    for row in (0, 2, 4):
        assert out.sampled_token_ids[row].item() == greedy[row].item()


# ----------------------------------------------------------------------------------------------- logprobs
def test_sampled_logprobs_are_raw_log_softmax_and_topk_matches_torch_topk():
    torch.manual_seed(2)
    logits = torch.randn(5, 400) * 3
    params = [SamplingParams(temperature=0.7, top_k=20, logprobs=3), SamplingParams(temperature=0.0, logprobs=7),
              SamplingParams(temperature=1.5, top_p=0.8), SamplingParams(min_p=0.2, logprobs=0),
              SamplingParams(seed=3, temperature=0.3, logprobs=1)]
    gens = [None, None, None, None, make_generator(3)]
    out = _sample(logits, params, gens)
    reference = torch.log_softmax(logits, dim=-1)
    tokens = out.sampled_token_ids
    assert out.sampled_logprobs.dtype == torch.float32 and out.sampled_logprobs.shape == (5,)
    torch.testing.assert_close(out.sampled_logprobs, reference[torch.arange(5), tokens], rtol=0, atol=1e-5)
    assert out.topk_logprobs.shape == (5, 7) and out.topk_token_ids.shape == (5, 7)
    ref_values, ref_ids = torch.topk(reference, 7, dim=-1)
    torch.testing.assert_close(out.topk_logprobs, ref_values, rtol=0, atol=1e-5)
    assert torch.equal(out.topk_token_ids, ref_ids)


def test_no_topk_when_no_row_asks_for_logprobs():
    logits = torch.randn(3, 50)
    out = _sample(logits, [SamplingParams(), SamplingParams(temperature=0.0), SamplingParams(logprobs=0)])
    assert out.topk_logprobs is None and out.topk_token_ids is None


def test_non_float32_logits_are_accepted():
    logits = torch.randn(4, 64, dtype=torch.float64)
    out = _sample(logits, [SamplingParams(temperature=0.0), SamplingParams(top_k=5)] * 2)
    assert torch.equal(out.sampled_token_ids[::2], torch.argmax(logits, dim=-1)[::2])
    assert out.sampled_logprobs.dtype == torch.float32


# ----------------------------------------------------------------------------------------------- distributions
FILTER_CASES = [
    dict(temperature=1.0),
    dict(temperature=0.5),
    dict(temperature=2.0),
    dict(top_k=5),
    dict(temperature=0.7, top_p=0.8),
    dict(top_p=0.5),
    dict(temperature=1.3, top_k=10, top_p=0.9),
    dict(min_p=0.1),
    dict(temperature=0.8, min_p=0.3),
    dict(top_k=20, top_p=0.7, min_p=0.05),
    dict(top_k=1),
    dict(top_p=0.01),
]


@pytest.mark.parametrize("case_index", range(len(FILTER_CASES)),
                         ids=[",".join(f"{k}={v}" for k, v in c.items()) for c in FILTER_CASES])
def test_filtered_distribution_matches_reference(case_index):
    case = FILTER_CASES[case_index]
    torch.manual_seed(100 + case_index)
    vocab, num_samples = 40, 12000
    row = torch.randn(vocab) * 1.5
    logits = row.expand(num_samples, vocab).contiguous()
    out = _sample(logits, [SamplingParams(**case)] * num_samples)
    tokens = out.sampled_token_ids
    params = dict(temperature=case.get("temperature", 1.0), top_k=case.get("top_k", -1),
                  top_p=case.get("top_p", 1.0), min_p=case.get("min_p", 0.0))
    loose_support = _reference_probs(row, **params, p_slack=1e-4, min_p_slack=1e-4) > 0
    assert loose_support[tokens].all(), "sampled a token the filters exclude"
    ok, stat, df, small_ok = _chi_square_ok(tokens, _reference_probs(row, **params), num_samples)
    assert ok and small_ok, f"chi-square {stat:.1f} with {df} degrees of freedom"


def test_mixed_rows_in_one_batch_each_follow_their_own_parameters():
    torch.manual_seed(11)
    vocab, per_case = 30, 6000
    cases = [dict(top_k=4), dict(top_p=0.6, temperature=0.9), dict(min_p=0.2), dict(), dict(temperature=0.0)]
    rows = torch.randn(len(cases), vocab) * 1.5
    # Interleave the cases so every batch position holds each kind.
    logits = rows.repeat(per_case, 1)
    params = [SamplingParams(**c) for c in cases] * per_case
    tokens = _sample(logits, params).sampled_token_ids.view(per_case, len(cases))
    for j, case in enumerate(cases):
        if case.get("temperature") == 0.0:
            assert (tokens[:, j] == torch.argmax(rows[j])).all()
            continue
        params_j = dict(temperature=case.get("temperature", 1.0), top_k=case.get("top_k", -1),
                        top_p=case.get("top_p", 1.0), min_p=case.get("min_p", 0.0))
        assert (_reference_probs(rows[j], **params_j, p_slack=1e-4, min_p_slack=1e-4) > 0)[tokens[:, j]].all()
        ok, stat, df, small_ok = _chi_square_ok(tokens[:, j], _reference_probs(rows[j], **params_j), per_case)
        assert ok and small_ok, (case, stat, df)


@pytest.mark.parametrize("rounds", [(2, 8), (4,), ()])
def test_top_p_candidate_rounds_give_the_same_distribution(rounds):
    """A flat distribution does not fit in the first candidates: the fallback rounds must still be exact."""
    torch.manual_seed(12)
    vocab, num_samples = 48, 10000
    row = torch.randn(vocab) * 0.3
    logits = row.expand(num_samples, vocab).contiguous()
    half = num_samples // 2
    params = [SamplingParams(top_p=0.75)] * half + [SamplingParams(top_p=0.75, top_k=40)] * half
    tokens = _sample(logits, params, sampler=Sampler(top_p_candidate_rounds=rounds)).sampled_token_ids
    for part, top_k in ((tokens[:half], -1), (tokens[half:], 40)):
        assert (_reference_probs(row, top_k=top_k, top_p=0.75, p_slack=1e-4) > 0)[part].all()
        ok, stat, df, small_ok = _chi_square_ok(part, _reference_probs(row, top_k=top_k, top_p=0.75), half)
        assert ok and small_ok, (stat, df)


def test_large_vocab_support_only():
    """Whisper-sized vocabulary: every sampled token is in the reference's allowed set."""
    torch.manual_seed(13)
    vocab = 51865
    logits = torch.randn(16, vocab) * 4
    cases = [dict(top_k=50), dict(top_p=0.9), dict(top_p=0.3, temperature=0.5), dict(min_p=0.5),
             dict(top_k=3000, top_p=0.95, min_p=0.01), dict(temperature=0.0), dict(), dict(top_p=0.99)] * 2
    out = _sample(logits, [SamplingParams(**c) for c in cases])
    for row, case in enumerate(cases):
        token = out.sampled_token_ids[row].item()
        if case.get("temperature") == 0.0:
            assert token == torch.argmax(logits[row]).item()
            continue
        support = _reference_probs(logits[row], temperature=case.get("temperature", 1.0), top_k=case.get("top_k", -1),
                                   top_p=case.get("top_p", 1.0), min_p=case.get("min_p", 0.0), p_slack=1e-4,
                                   min_p_slack=1e-4) > 0
        assert support[token], (row, case)


# ----------------------------------------------------------------------------------------------- seeds
SEEDED_CASES = [dict(), dict(temperature=0.8, top_p=0.9), dict(top_k=7, min_p=0.05), dict(top_p=0.5)]


@pytest.mark.parametrize("case", SEEDED_CASES, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()) or "plain")
def test_seeded_row_does_not_depend_on_the_batch(case):
    torch.manual_seed(20)
    vocab, steps = 2000, 6
    step_logits = [torch.randn(vocab) * 2 for _ in range(steps)]
    seeded = SamplingParams(seed=1234, **case)
    others = [SamplingParams(), SamplingParams(temperature=0.0), SamplingParams(top_k=1500),
              SamplingParams(top_p=0.99, temperature=3.0), SamplingParams(top_k=3, top_p=0.5),
              SamplingParams(seed=99, min_p=0.1), SamplingParams(top_p=0.9)]
    compositions = [(0, []), (3, others[:5]), (7, others), (1, others[3:]), (2, others[::-1])]
    results = []
    for position, other_params in compositions:
        generator = make_generator(1234)
        torch.manual_seed(len(other_params))  # the global RNG state must not matter either
        other_gens = {i: make_generator(99) for i, p in enumerate(other_params) if p.seed is not None}
        tokens = []
        for logits_row in step_logits:
            batch_params = list(other_params)
            batch_gens = [other_gens.get(i) for i in range(len(other_params))]
            position_here = min(position, len(batch_params))
            batch_params.insert(position_here, seeded)
            batch_gens.insert(position_here, generator)
            logits = torch.randn(len(batch_params), vocab) * 2
            logits[position_here] = logits_row
            out = _sample(logits, batch_params, batch_gens)
            tokens.append(out.sampled_token_ids[position_here].item())
        results.append(tokens)
    assert all(r == results[0] for r in results), results
    # ... and the seed matters: another seed gives another token sequence.
    other_seed = make_generator(4321)
    different = [_sample(row.unsqueeze(0), [seeded], [other_seed]).sampled_token_ids.item() for row in step_logits]
    if case.get("top_p") != 0.5:  # a tight filter may leave a single candidate at some steps
        assert different != results[0]


def test_unseeded_rows_use_the_global_rng():
    logits = torch.zeros(4, 1000)
    params = [SamplingParams()] * 4
    torch.manual_seed(5)
    first = _sample(logits, params).sampled_token_ids
    torch.manual_seed(5)
    again = _sample(logits, params).sampled_token_ids
    second = _sample(logits, params).sampled_token_ids
    assert torch.equal(first, again)
    assert not torch.equal(first, second)


# ----------------------------------------------------------------------------------------------- metadata
def test_metadata_build():
    params = [SamplingParams(temperature=0.0, logprobs=2), SamplingParams(temperature=0.5, top_k=10, seed=1),
              SamplingParams(top_p=0.9, min_p=0.1), SamplingParams(logprobs=5)]
    gen = make_generator(1)
    md = SamplingMetadata.build(list(zip(params, [None, gen, None, None])), "cpu")
    assert md.num_rows == 4
    assert md.temperatures.tolist() == pytest.approx([1.0, 0.5, 1.0, 1.0])
    assert md.top_k_list == [-1, 10, -1, -1]
    assert md.top_ps.tolist() == pytest.approx([1.0, 1.0, 0.9, 1.0])
    assert md.min_ps.tolist() == pytest.approx([0.0, 0.0, 0.1, 0.0])
    assert md.generators == [None, gen, None, None]
    assert md.filtered_rows == [1, 2] and md.plain_rows == [3]
    assert not md.all_greedy
    assert md.max_num_logprobs == 5

    plain = SamplingMetadata.build([(SamplingParams(temperature=0.0, top_k=5), None)] * 2, "cpu")
    assert plain.all_greedy and not plain.plain_rows and not plain.filtered_rows
    assert plain.max_num_logprobs == 0


def test_make_generator_is_reproducible():
    a, b = make_generator(42), make_generator(42)
    assert torch.equal(torch.rand(5, generator=a), torch.rand(5, generator=b))
    assert not torch.equal(torch.rand(5, generator=make_generator(42)), torch.rand(5, generator=make_generator(43)))


def test_wrong_row_count_is_rejected():
    with pytest.raises(ValueError):
        _sample(torch.randn(3, 10), [SamplingParams()] * 2)
