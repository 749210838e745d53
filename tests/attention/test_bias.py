"""The engine's block-diagonal masks against xformers' bias classes: the same blocks and the same materialized mask
for every kind, the conversion the xformers backend makes at its boundary, and the same refusals."""
import pytest
import torch

from seq2seq_engine.attention.backends.xformers_backend import _xformers_attn_bias, to_xformers_bias
from seq2seq_engine.attention.bias import (BlockDiagonalCausalFromBottomRightMask, BlockDiagonalCausalMask,
                                           BlockDiagonalMask, is_causal, segment_bounds)

KINDS = {"none": "BlockDiagonalMask", "causal": "BlockDiagonalCausalMask",
         "bottom_right": "BlockDiagonalCausalFromBottomRightMask"}
OURS = {"none": BlockDiagonalMask, "causal": BlockDiagonalCausalMask,
        "bottom_right": BlockDiagonalCausalFromBottomRightMask}
CASES = [  # (kind, q lens, k lens or None)
    ("causal", [3, 1, 4], None),
    ("causal", [2, 3], [5, 3]),
    ("bottom_right", [2, 1, 3], [5, 1, 7]),
    ("none", [4, 2, 3], None),
    ("none", [1, 1, 2], [6, 3, 2]),
    ("none", [0, 2], [3, 2]),
]


@pytest.fixture(scope="module")
def xformers_bias():
    return _xformers_attn_bias()


@pytest.mark.parametrize("kind,q_lens,k_lens", CASES)
def test_masks_match_xformers(xformers_bias, kind, q_lens, k_lens):
    ours = OURS[kind].from_seqlens(q_lens, k_lens)
    theirs = getattr(xformers_bias, KINDS[kind]).from_seqlens(q_lens, k_lens, device=torch.device("cpu"))
    assert ours.q_seqinfo.seqstart_py == theirs.q_seqinfo.seqstart_py
    assert ours.k_seqinfo.seqstart_py == theirs.k_seqinfo.seqstart_py
    shape = (sum(q_lens), sum(k_lens or q_lens))
    torch.testing.assert_close(ours.materialize(), theirs.materialize(shape, dtype=torch.float32, device="cpu"))
    assert is_causal(ours) == (kind != "none")


@pytest.mark.parametrize("kind,q_lens,k_lens", CASES)
def test_conversion_at_the_xformers_boundary(xformers_bias, kind, q_lens, k_lens):
    ours = OURS[kind].from_seqlens(q_lens, k_lens)
    converted = to_xformers_bias(ours, torch.device("cpu"))
    assert type(converted) is getattr(xformers_bias, KINDS[kind])
    assert converted.q_seqinfo.seqstart_py == ours.q_seqinfo.seqstart_py
    assert converted.k_seqinfo.seqstart_py == ours.k_seqinfo.seqstart_py
    assert to_xformers_bias(ours, torch.device("cpu")) is converted   # one conversion per step's mask


def test_segment_bounds_and_refusals():
    bias = BlockDiagonalMask.from_seqlens([2, 3], [4, 1])
    assert segment_bounds(bias) == [(0, 2, 0, 4), (2, 5, 4, 5)]
    with pytest.raises(ValueError, match="at least as many keys"):
        BlockDiagonalCausalFromBottomRightMask.from_seqlens([3], [2])
    with pytest.raises(ValueError, match="query blocks"):
        BlockDiagonalMask.from_seqlens([1, 2], [3])
    with pytest.raises(ValueError, match=">= 0"):
        BlockDiagonalMask.from_seqlens([-1])
