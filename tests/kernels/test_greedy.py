"""The sampler's one-read greedy step (kernels/native_greedy.py) against torch's argmax and logsumexp, both paths."""
import pytest
import torch

from seq2seq_engine.kernels.native_greedy import greedy_logsumexp


def _logits(seed, rows, vocab, scale=4.0):
    return torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)) * scale


def _check(logits):
    tokens, lse = greedy_logsumexp(logits)
    assert tokens.dtype == torch.long and lse.dtype == torch.float32 and tokens.shape == lse.shape == logits.shape[:1]
    assert torch.equal(tokens, logits.argmax(dim=-1))
    torch.testing.assert_close(lse, torch.logsumexp(logits, dim=-1), rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("rows, vocab", [(1, 58101), (7, 5), (5, 1024), (300, 3000)])  # 300 x 3000: threaded
def test_tokens_and_logsumexp_match_torch(kernel_path, rows, vocab):
    _check(_logits(0, rows, vocab))


def test_ties_take_the_first_maximum_within_and_across_blocks(kernel_path):
    logits = _logits(1, 4, 5000)
    top = logits.max() + 1.0
    logits[0, [2100, 2101, 4000]] = top         # within one block, and a later block
    logits[1, [10, 1500]] = top                 # across blocks
    logits[2, :] = 0.5                          # all equal
    logits[3, [4999, 3]] = top
    _check(logits)
    assert greedy_logsumexp(logits)[0].tolist() == [2100, 10, 0, 3]


def test_banned_tokens_of_minus_infinity_add_nothing(kernel_path):
    logits = _logits(2, 3, 6000)
    logits[0, :4500] = float("-inf")            # whole leading blocks banned
    logits[1, ::2] = float("-inf")
    logits[2, 5999] = float("-inf")
    _check(logits)


def test_a_row_strided_view_and_bad_shapes(kernel_path):
    wide = _logits(3, 6, 3000)
    _check(wide[:, 100:2900])
    _check(wide[::2])
    with pytest.raises(ValueError, match="rows, vocab"):
        greedy_logsumexp(wide[0])
    empty_tokens, empty_lse = greedy_logsumexp(wide[:0])
    assert empty_tokens.shape == empty_lse.shape == (0,)
