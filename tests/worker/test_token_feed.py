"""The pending tokens written into a fed step's inputs: by sequence, whatever the order, only for fed sequences."""
import pytest
import torch

from seq2seq_engine.worker.token_feed import TokenFeed


def _inputs(n):
    return torch.randint(1000, 2000, (n,), generator=torch.Generator().manual_seed(n))


def test_same_order_takes_the_tokens_as_they_are():
    tokens = torch.randint(0, 500, (4,), generator=torch.Generator().manual_seed(1))
    inputs = _inputs(6)     # two padding rows after the four sequences
    padding = inputs[4:].clone()
    TokenFeed(tokens, {10: 0, 11: 1, 12: 2, 13: 3}).write_inputs(inputs, [10, 11, 12, 13])
    assert inputs[:4].tolist() == tokens.tolist()
    assert inputs[4:].tolist() == padding.tolist()


def test_reordered_and_partly_fed_rows_take_their_own_token():
    tokens = torch.randint(0, 500, (4,), generator=torch.Generator().manual_seed(2))
    inputs = _inputs(5)
    kept = inputs.clone()
    # sequence 11 finished (not in the step), 14 is not fed (its input is the host's), the rest reordered
    feed = TokenFeed(tokens, {10: 0, 11: 1, 12: 2, 13: 3})
    feed.write_inputs(inputs, [13, 14, 10, 12])
    assert inputs.tolist() == [int(tokens[3]), int(kept[1]), int(tokens[0]), int(tokens[2]), int(kept[4])]


def test_too_few_inputs_is_an_internal_error():
    with pytest.raises(AssertionError, match="2 input tokens for 3 sequences"):
        TokenFeed(torch.arange(3), {1: 0, 2: 1, 3: 2}).write_inputs(torch.zeros(2, dtype=torch.long), [1, 2, 3])
