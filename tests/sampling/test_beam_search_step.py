"""The beam-search step (seq2seq_engine/sampling/beam_search.py) against references on random log-probs: a brute-force
ranking of all continuations, and HF transformers' own beam-search helpers driven over a fake model."""
import math
import random

import pytest
import torch
from beam_reference import hf_beam_search, random_logprob_fn

from seq2seq_engine.sampling.beam_search import (BeamHypotheses, BeamSpec, beam_search_step, num_beam_candidates,
                                                 rank_candidates)


def _our_beam_search(logprob_fn, prompt, spec, stats):
    """Drive beam_search_step the way the engine does: each running beam passes only its top candidates."""
    hypotheses = BeamHypotheses(spec.beam_width, spec.length_penalty)
    beams = [([], 0.0)]
    generated_len = 0
    while True:
        ids, lps = [], []
        for tokens, _ in beams:
            top = logprob_fn(list(prompt) + tokens).topk(spec.num_candidates)
            lps.append(top.values.tolist())
            ids.append(top.indices.tolist())
        result = beam_search_step([score for _, score in beams], ids, lps, generated_len, spec, hypotheses,
                                  make_payload=lambda cand: beams[cand.parent][0] + [cand.token_id])
        beams = [(beams[cand.parent][0] + [cand.token_id], cand.cumulative_logprob) for cand in result.next_beams]
        stats["stopped"] += sum(hyp.payload[-1] in spec.stop_token_ids for hyp in result.new_hypotheses)
        generated_len += 1
        if result.done:
            return [(hyp.payload, hyp.score) for hyp in hypotheses.ranked]


CASES = [(width, lp, es, stops)
         for width in (1, 2, 4) for lp in (0.0, 0.8, 1.0, 2.0, -0.5) for es in (True, False, "never")
         for stops in ((2,), (2, 5))]


@pytest.mark.parametrize("width,length_penalty,early_stopping,stop_ids", CASES)
def test_full_beam_search_matches_hf_helpers_on_random_logprobs(width, length_penalty, early_stopping, stop_ids):
    stats = {"stopped": 0}
    for trial in range(6):
        seed = hash((width, length_penalty, str(early_stopping), stop_ids, trial)) % 10_000
        logprob_fn = random_logprob_fn(vocab_size=12, seed=seed, sharpness=2.0, boost={2: 1.0})
        prompt = random.Random(seed).choices(range(3, 12), k=1 + trial)
        max_new = 3 + trial * 2
        spec = BeamSpec(width, length_penalty, early_stopping, frozenset(stop_ids), max_new)
        ours = _our_beam_search(logprob_fn, prompt, spec, stats)
        reference = hf_beam_search(logprob_fn, prompt, width, max_new, length_penalty, early_stopping, stop_ids)
        assert [tokens for tokens, _ in ours] == [tokens for tokens, _ in reference]
        assert [s for _, s in ours] == pytest.approx([s for _, s in reference], rel=1e-5, abs=1e-5)
    assert stats["stopped"] > 0, "no stop token ever ended a hypothesis: the stop rules went untested"


def test_ranking_from_per_row_top_candidates_equals_brute_force_over_all_tokens():
    rng = torch.Generator().manual_seed(0)
    for trial in range(50):
        num_beams, vocab = 1 + trial % 4, 20
        k = num_beam_candidates(num_beams, 1)
        scores = (torch.randn(num_beams, generator=rng) * 3).tolist()
        rows = torch.log_softmax(torch.randn(num_beams, vocab, generator=rng) * 2, dim=-1)
        rows[0, 3] = -math.inf  # a banned token is never a candidate
        top = rows.topk(k)
        ours = rank_candidates(scores, top.indices.tolist(), top.values.tolist(), k)
        brute = sorted(((scores[b] + float(rows[b, t]), b, t) for b in range(num_beams) for t in range(vocab)
                        if rows[b, t] > -math.inf), reverse=True)[:k]
        assert [(c.parent, c.token_id) for c in ours] == [(b, t) for _, b, t in brute]
        assert [c.cumulative_logprob for c in ours] == pytest.approx([s for s, _, _ in brute])


def test_a_stop_candidate_ranked_below_beam_width_is_not_a_hypothesis():
    spec = BeamSpec(beam_width=2, length_penalty=1.0, early_stopping=False, stop_token_ids=frozenset({2}),
                    max_generated_len=10)
    hypotheses = BeamHypotheses(2, 1.0)
    # Beam 0 ranks (5, -0.1), (6, -0.2), then EOS (-0.3) third: EOS is dropped, not kept as a hypothesis.
    result = beam_search_step([0.0], [[5, 6, 2, 7]], [[-0.1, -0.2, -0.3, -0.4]], 0, spec, hypotheses)
    assert hypotheses.ranked == [] and [c.token_id for c in result.next_beams] == [5, 6] and not result.done
    # Ranked second, EOS becomes a hypothesis scored logprob / 1 ** 1, and the next two non-stop tokens run on.
    result = beam_search_step([0.0], [[5, 2, 6, 7]], [[-0.1, -0.2, -0.3, -0.4]], 0, spec, hypotheses)
    assert [(h.payload.token_id, h.score) for h in hypotheses.ranked] == [(2, pytest.approx(-0.2))]
    assert [c.token_id for c in result.next_beams] == [5, 6]


def test_early_stopping_true_stops_once_beam_width_hypotheses_exist():
    spec = BeamSpec(beam_width=2, length_penalty=1.0, early_stopping=True, stop_token_ids=frozenset({2}),
                    max_generated_len=10)
    hypotheses = BeamHypotheses(2, 1.0)
    # Both beams' EOS rank in the first two of the candidates: two hypotheses of 4 generated tokens each.
    result = beam_search_step([-1.0, -1.05], [[2, 4, 5], [2, 6, 7]], [[-0.1, -0.2, -0.3], [-0.1, -0.2, -0.3]],
                              3, spec, hypotheses)
    assert len(hypotheses.ranked) == 2 and result.done
    assert [h.score for h in hypotheses.ranked] == pytest.approx([-1.1 / 4, -1.15 / 4])
    assert [c.token_id for c in result.next_beams] == [4, 6]
