"""Beam search's one-read top-k (kernels/native_topk.py) against torch.topk, both paths."""
import pytest
import torch

from seq2seq_engine.kernels.native_topk import row_topk


def _logits(seed, rows, vocab, scale=4.0):
    return torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)) * scale


def _check(logits, k):
    values, indices = row_topk(logits, k)
    expected_values, expected_indices = logits.topk(k)
    assert values.dtype == torch.float32 and indices.dtype == torch.long and values.shape == (logits.shape[0], k)
    assert torch.equal(values, expected_values)
    assert torch.equal(indices, expected_indices)


@pytest.mark.parametrize("rows, vocab, k", [(1, 51865, 10), (40, 51865, 10), (7, 5, 5), (3, 1000, 1),
                                            (300, 3000, 8), (2, 130, 64)])      # 300 x 3000: threaded
def test_values_and_indices_match_torch(kernel_path, rows, vocab, k):
    _check(_logits(0, rows, vocab), k)


def test_an_ascending_row_inserts_every_block_and_k_zero_is_empty(kernel_path):
    ascending = torch.arange(5000, dtype=torch.float32).repeat(3, 1) + _logits(1, 3, 5000, 1e-3)
    _check(ascending, 12)
    values, indices = row_topk(ascending, 0)
    assert values.shape == indices.shape == (3, 0)


def test_equal_values_are_all_kept_the_native_kernel_puts_the_lower_index_first(kernel_path):
    logits = _logits(2, 2, 4000)
    top = float(logits.max()) + 1.0
    logits[0, [3000, 7, 1500]] = top
    logits[1, :] = 0.25
    values, indices = row_topk(logits, 3)
    assert sorted(indices[0].tolist()) == [7, 1500, 3000] and values[0].tolist() == [top] * 3
    if kernel_path == "native":     # torch.topk promises no order among equal values
        assert indices.tolist() == [[7, 1500, 3000], [0, 1, 2]]


def test_banned_tokens_and_rows_with_fewer_than_k_allowed(kernel_path):
    logits = _logits(3, 4, 6000)
    logits[0, :5990] = float("-inf")            # ten allowed: all of them kept
    logits[1, ::2] = float("-inf")
    _check(logits, 10)
    logits[2, 3:] = float("-inf")               # three allowed, k = 5: torch's answer, -inf entries included
    values, indices = row_topk(logits, 5)
    assert torch.equal(values, logits.topk(5).values)
    assert indices[2, :3].tolist() == logits[2, :3].argsort(descending=True).tolist()


def test_a_row_strided_view_and_bad_arguments(kernel_path):
    wide = _logits(4, 6, 3000)
    _check(wide[:, 100:2900], 10)
    _check(wide[::2], 10)
    with pytest.raises(ValueError, match="rows, vocab"):
        row_topk(wide[0], 3)
    with pytest.raises(ValueError, match="k <= vocab"):
        row_topk(wide, 3001)
    values, indices = row_topk(wide[:0], 4)
    assert values.shape == indices.shape == (0, 4)
