"""The oneDNN-prepacked float32 logits head (models/packed_linear.py) against F.linear, and where it is installed."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from seq2seq_engine.models.packed_linear import PackedLinear, onednn_linear_available, pack_logits_head

pytestmark = pytest.mark.skipif(not onednn_linear_available(), reason="torch built without oneDNN")


def _randn(seed, *shape):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("rows", [1, 7, 130])
@pytest.mark.parametrize("bias", [False, True])
def test_packed_linear_matches_f_linear(rows, bias):
    weight, x = _randn(0, 3001, 96) * 0.1, _randn(1, rows, 96)
    b = _randn(2, 3001) if bias else None
    layer = PackedLinear(weight, b)
    torch.testing.assert_close(layer(x), F.linear(x, weight, b), rtol=1e-5, atol=1e-5)
    assert layer(x.view(rows, 1, 96)).shape == (rows, 1, 3001)
    assert layer(x[:0]).shape == (0, 3001)


def test_packed_linear_refuses_a_weight_it_cannot_pack():
    with pytest.raises(ValueError, match="float32"):
        PackedLinear(torch.ones(4, 4, dtype=torch.bfloat16))


class _Head(nn.Module):
    """The BART-family hooks pack_logits_head uses: lm_head or a tied weight, and set_lm_head."""

    def __init__(self, tied: bool) -> None:
        super().__init__()
        self.embed = nn.Embedding(50, 8)
        self.lm_head = None if tied else nn.Linear(8, 50, bias=False)

    def tied_lm_head_weight(self):
        return self.embed.weight if self.lm_head is None else None

    def set_lm_head(self, head):
        self.lm_head = head


@pytest.mark.parametrize("tied", [False, True])
def test_pack_logits_head_replaces_the_head_with_the_same_weight(tied):
    model = _Head(tied)
    weight = model.embed.weight if tied else model.lm_head.weight
    assert pack_logits_head(model)
    assert isinstance(model.lm_head, PackedLinear)
    assert model.lm_head.weight.data_ptr() == weight.data_ptr()
    x = _randn(3, 4, 8)
    torch.testing.assert_close(model.lm_head(x), F.linear(x, weight), rtol=1e-5, atol=1e-5)
    assert not pack_logits_head(nn.Linear(3, 3))        # no set_lm_head: not a BART-family model
