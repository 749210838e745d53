"""SamplingMetadata reads each run of rows sharing one SamplingParams object once: every field equals a row-by-row
reading of the same params (written out here), for runs, interleaved objects and equal-valued distinct objects."""
import random

import pytest
import torch

from seq2seq_engine.sampling.metadata import SamplingMetadata, make_generator
from seq2seq_engine.sampling_params import SamplingParams


def _row_by_row(params, generators):
    """The fields as one row at a time gives them."""
    greedy = [p.temperature == 0.0 for p in params]
    top_ks = [p.top_k if p.top_k is not None and p.top_k > 0 else -1 for p in params]
    random_rows = [i for i, g in enumerate(greedy) if not g]
    filtered = [i for i in random_rows if top_ks[i] > 0 or params[i].top_p < 1.0]
    return dict(
        temperatures=[1.0 if g else p.temperature for p, g in zip(params, greedy)],
        top_ps=[float(p.top_p) for p in params], min_ps=[float(p.min_p) for p in params], top_ks=top_ks,
        generators=[None if g else gen for g, gen in zip(greedy, generators)],
        filtered_rows=filtered, plain_rows=[i for i in random_rows if i not in filtered],
        all_greedy=not random_rows, max_num_logprobs=max([p.logprobs or 0 for p in params], default=0))


@pytest.mark.parametrize("seed", range(5))
def test_runs_equal_row_by_row(seed):
    rng = random.Random(seed)
    choices = [SamplingParams(temperature=0.0), SamplingParams(temperature=0.0, logprobs=3),
               SamplingParams(temperature=0.7, top_k=5), SamplingParams(temperature=1.3, top_p=0.9, min_p=0.05),
               SamplingParams(temperature=0.5), SamplingParams(temperature=0.5)]   # the last two: equal values
    params, generators = [], []
    for _ in range(rng.randint(1, 8)):                 # runs of random lengths, objects revisited
        chosen = rng.choice(choices)
        for _ in range(rng.randint(1, 5)):
            params.append(chosen)
            generators.append(make_generator(rng.randint(0, 99)) if rng.random() < 0.5 else None)
    metadata = SamplingMetadata.from_columns(params, generators, "cpu")
    want = _row_by_row(params, generators)
    assert metadata.temperatures.tolist() == pytest.approx(want["temperatures"])
    assert metadata.temperatures.dtype == torch.float32
    assert metadata.top_ps.tolist() == pytest.approx(want["top_ps"])
    assert metadata.min_ps.tolist() == pytest.approx(want["min_ps"])
    assert metadata.top_k_list == want["top_ks"]
    assert all(a is b for a, b in zip(metadata.generators, want["generators"]))
    assert len(metadata.generators) == len(params)
    assert metadata.filtered_rows == want["filtered_rows"] and metadata.plain_rows == want["plain_rows"]
    assert metadata.all_greedy == want["all_greedy"]
    assert metadata.max_num_logprobs == want["max_num_logprobs"]


def test_no_rows():
    metadata = SamplingMetadata.from_columns([], [], "cpu")
    assert metadata.num_rows == 0 and metadata.all_greedy
