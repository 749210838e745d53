"""The native panel linear kernel (kernels/native_linear.py, csrc/panel_linear_cpu.c) against F.linear on random
inputs: every row-tile size, output widths off the 32-column panel, strided rows, with and without bias; a row's
result does not depend on how many rows share the call."""
import pytest
import torch
import torch.nn.functional as F

from seq2seq_engine.kernels.native_linear import (PANEL_ACTIVATIONS, PANEL_WIDTH, panel_linear, panel_linear_available,
                                                  to_panels)

pytestmark = pytest.mark.skipif(not panel_linear_available(), reason="no AVX-512 panel kernel on this machine")


def _randn(seed, *shape):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def test_to_panels_lays_out_column_panels_padded_with_zeros():
    weight = _randn(0, 37, 5)
    panels = to_panels(weight)
    assert panels.shape == (2, 5, PANEL_WIDTH) and panels.is_contiguous()
    assert torch.equal(panels[1, :, :5], weight[32:].t()) and not panels[1, :, 5:].any()
    assert torch.equal(panels[0], weight[:32].t())


@pytest.mark.parametrize("rows", [1, 3, 6, 8, 9, 17, 64, 131])
@pytest.mark.parametrize("out_features,in_features", [(1, 7), (31, 16), (32, 33), (45, 64), (80, 40), (300, 257)])
@pytest.mark.parametrize("bias", [False, True])
def test_panel_linear_matches_f_linear(rows, out_features, in_features, bias):
    weight, x = _randn(1, out_features, in_features), _randn(2, rows, in_features)
    b = _randn(3, out_features) if bias else None
    got = panel_linear(x, to_panels(weight), out_features, b)
    assert got.shape == (rows, out_features) and got.is_contiguous()
    torch.testing.assert_close(got, F.linear(x.double(), weight.double(), None if b is None else b.double()).float(),
                               rtol=1e-5, atol=1e-5 * in_features ** 0.5)


@pytest.mark.parametrize("out_features", [45, 96, 300])
def test_a_rows_output_is_the_same_bits_in_every_batch_size(out_features):
    """Few rows run in 8 x 32 tiles and many in 6 x 64 tiles: both sum over K in the same order, so a request's
    tokens do not depend on how many others share its step."""
    weight, bias, x = _randn(13, out_features, 200), _randn(14, out_features), _randn(15, 131, 200)
    panels = to_panels(weight)
    together = panel_linear(x, panels, out_features, bias)
    for first in range(0, 131, 5):
        alone = panel_linear(x[first:first + 5], panels, out_features, bias)
        assert torch.equal(alone, together[first:first + 5]), f"rows {first}..{first + 4} changed with the batch"


@pytest.mark.parametrize("activation", sorted(PANEL_ACTIVATIONS))
@pytest.mark.parametrize("rows", [2, 11])
def test_panel_linear_applies_the_activation_after_the_bias(activation, rows):
    weight, bias, x = _randn(10, 70, 48) * 0.3, _randn(11, 70), _randn(12, rows, 48)
    function = {"relu": F.relu, "silu": F.silu, "swish": F.silu, "gelu": F.gelu}[activation]
    torch.testing.assert_close(panel_linear(x, to_panels(weight), 70, bias, activation),
                               function(F.linear(x, weight, bias)), rtol=1e-5, atol=1e-5)


def test_panel_linear_reads_strided_rows_and_no_rows():
    weight, wide = _randn(4, 40, 24), _randn(5, 11, 60)
    x = wide[:, 10:34]                                   # row stride 60, unit column stride
    torch.testing.assert_close(panel_linear(x, to_panels(weight), 40), F.linear(x, weight), rtol=1e-5, atol=1e-5)
    assert panel_linear(x[:0], to_panels(weight), 40).shape == (0, 40)


def test_panel_linear_refuses_inputs_that_do_not_fit():
    panels = to_panels(_randn(6, 40, 24))
    with pytest.raises(ValueError, match=r"input torch.float32 \(3, 23\)"):
        panel_linear(_randn(7, 3, 23), panels, 40)
    with pytest.raises(ValueError, match="does not fit"):
        panel_linear(_randn(7, 3, 24), panels, 70)                   # 70 outputs need 3 panels
    with pytest.raises(ValueError, match="does not fit"):
        panel_linear(_randn(7, 24, 3).t(), panels, 40)               # columns not contiguous
    with pytest.raises(ValueError, match=r"bias must be float32 \[40\]"):
        panel_linear(_randn(7, 3, 24), panels, 40, _randn(8, 39))
    with pytest.raises(ValueError, match="2-d float32 weight"):
        to_panels(_randn(9, 4, 4).double())
    with pytest.raises(ValueError, match="activation 'gelu_new' is not one of"):
        panel_linear(_randn(7, 3, 24), panels, 40, activation="gelu_new")
