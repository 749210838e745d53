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
def test_layer_norm_matches_hf(dtype):
    gen = torch.Generator().manual_seed(0)
    ours, theirs = T5LayerNorm(24, 1e-6), HFT5LayerNorm(24, eps=1e-6)
    with torch.no_grad():
        ours.weight.copy_(torch.randn(24, generator=gen))
        theirs.weight.copy_(ours.weight)
    ours, theirs = ours.to(dtype), theirs.to(dtype)
    hidden = (torch.randn(5, 24, generator=gen) * 30.0).to(dtype)
    got, want = ours(hidden), theirs(hidden)
    assert got.dtype == want.dtype == dtype
    torch.testing.assert_close(got, want, rtol=0, atol=0)


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
