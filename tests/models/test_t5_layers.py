"""T5 layer pieces against HF transformers': relative position buckets (encoder and decoder, several bucket counts
and distances), the RMS layer norm in float32 and bfloat16, and the feed-forward flavours a config names."""
import pytest
import torch
import transformers
from transformers.models.t5.modeling_t5 import T5Attention, T5LayerNorm as HFT5LayerNorm

from seq2seq_engine.models.t5_layers import T5LayerNorm, feed_forward_activation, relative_position_bucket


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("num_buckets,max_distance", [(32, 128), (8, 20), (6, 7), (10, 300)])
def test_relative_position_bucket_matches_hf(bidirectional, num_buckets, max_distance):
    relative = torch.arange(-400, 401).view(1, -1) - torch.arange(0, 3).view(-1, 1)
    ours = relative_position_bucket(relative, bidirectional, num_buckets, max_distance)
    theirs = T5Attention._relative_position_bucket(relative, bidirectional=bidirectional, num_buckets=num_buckets,
                                                   max_distance=max_distance)
    assert torch.equal(ours, theirs)
    assert int(ours.min()) >= 0 and int(ours.max()) < num_buckets


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [5, 300])    # 300 x 768 runs the native kernel on every thread
def test_layer_norm_matches_hf_with_and_without_the_residual_add(dtype, rows):
    gen = torch.Generator().manual_seed(0)
    width = 24 if rows == 5 else 768
    ours, theirs = T5LayerNorm(width, 1e-6), HFT5LayerNorm(width, eps=1e-6)
    with torch.no_grad():
        ours.weight.copy_(torch.randn(width, generator=gen))
        theirs.weight.copy_(ours.weight)
    ours, theirs = ours.to(dtype), theirs.to(dtype)
    hidden = (torch.randn(rows, width, generator=gen) * 30.0).to(dtype)
    residual = torch.randn(rows, width, generator=gen).to(dtype)
    # the sum of squares is taken in another order than torch's, so the last bit may differ
    tolerance = dict(rtol=1e-6, atol=1e-6) if dtype == torch.float32 else dict(rtol=8e-3, atol=1e-5)
    normed, passed = ours(hidden)
    assert normed.dtype == dtype and passed is hidden
    torch.testing.assert_close(normed, theirs(hidden), **tolerance)
    normed, summed = ours(hidden, residual)
    assert torch.equal(summed, hidden + residual)
    torch.testing.assert_close(normed, theirs(hidden + residual), **tolerance)


@pytest.mark.parametrize("proj,expected", [("relu", ("relu", False)), ("gated-gelu", ("gelu_new", True)),
                                           ("gated-silu", ("silu", True)), ("gelu", ("gelu", False))])
def test_feed_forward_activation_reads_the_config_like_hf(proj, expected):
    assert feed_forward_activation(transformers.T5Config(feed_forward_proj=proj)) == expected
    plain = type("Config", (), {"feed_forward_proj": proj})()     # a config without the derived fields
    assert feed_forward_activation(plain) == expected


def test_feed_forward_activation_refuses_a_malformed_name():
    plain = type("Config", (), {"feed_forward_proj": "double-gated-gelu"})()
    with pytest.raises(ValueError, match="feed_forward_proj must be 'ACT' or 'gated-ACT', got 'double-gated-gelu'"):
        feed_forward_activation(plain)
