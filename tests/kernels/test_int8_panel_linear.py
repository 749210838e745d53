"""The native int8 panel kernel (kernels/native_int8.py, csrc/int8_linear_cpu.c) against a float64 reference of the
same arithmetic on random inputs: rows rounded to int8 on their own max |x| / 127 grid, exact integer products, then
the row and column scales and the bias. Every row-tile size, widths off the 32-column panel and depths off the
4-channel group, strided rows, zero rows, activations, the packing and its errors."""
import pytest
import torch
import torch.nn.functional as F

from seq2seq_engine.kernels.native_int8 import (GROUP, int8_linear_available, int8_panel_linear, to_int8_panels,
                                                unpack_int8_panels)
from seq2seq_engine.kernels.native_linear import PANEL_ACTIVATIONS, PANEL_WIDTH
from seq2seq_engine.models.int8 import quantize_weight

pytestmark = pytest.mark.skipif(not int8_linear_available(), reason="no AVX-512 VNNI int8 kernel on this machine")


def _randn(seed, *shape):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _reference(x, qweight, scale, bias=None):
    """float64 (x_q W_q^T) * row_scale * scale + bias, x_q = round(x * 127 / max|x_row|) as the kernel rounds it."""
    amax = x.abs().amax(dim=1, keepdim=True)
    inverse = torch.where(amax > 0, 127.0 / amax, torch.zeros_like(amax))        # float32, as in the kernel
    x_q = torch.round(x * inverse).clamp(-127, 127).double()
    out = (x_q @ qweight.double().t()) * (amax.double() / 127) * scale.double()
    return out if bias is None else out + bias.double()


def test_to_int8_panels_groups_four_channels_of_32_columns_and_unpacks():
    qweight, scale = quantize_weight(_randn(0, 37, 9))
    packed = to_int8_panels(qweight, scale)
    assert packed.panels.shape == (2, 3, PANEL_WIDTH, GROUP) and packed.panels.dtype == torch.int8
    assert torch.equal(packed.panels[0, 1, 7], qweight[7, 4:8])                # group 1 = channels 4..7
    assert torch.equal(packed.panels[1, 2, 4, :1], qweight[36, 8:]) and not packed.panels[1, 2, 4, 1:].any()
    assert not packed.panels[1, :, 5:].any()                                     # columns past 37
    assert torch.equal(packed.offsets[:37], qweight.sum(dim=1, dtype=torch.int32) * 128)
    assert not packed.offsets[37:].any() and not packed.scales[37:].any()
    assert torch.equal(packed.scales[:37], scale)
    assert torch.equal(unpack_int8_panels(packed), qweight)


@pytest.mark.parametrize("rows", [1, 3, 8, 9, 17, 64, 131])
@pytest.mark.parametrize("out_features,in_features", [(1, 7), (31, 16), (32, 33), (45, 64), (300, 258)])
@pytest.mark.parametrize("bias", [False, True])
def test_int8_panel_linear_matches_the_reference(rows, out_features, in_features, bias):
    qweight, scale = quantize_weight(_randn(1, out_features, in_features) * 0.1)
    x = _randn(2, rows, in_features) * torch.logspace(-3, 3, rows)[:, None]
    b = _randn(3, out_features) if bias else None
    got = int8_panel_linear(x, to_int8_panels(qweight, scale), b)
    assert got.shape == (rows, out_features) and got.is_contiguous()
    expected = _reference(x, qweight, scale, b)
    torch.testing.assert_close(got.double(), expected, rtol=1e-6, atol=1e-6 * expected.abs().max().item())


def test_int8_panel_linear_quantizes_activations_to_127_levels_per_row():
    """Its error against the unquantized float product is that of 8-bit rows: above zero, below 1%."""
    weight, x = _randn(4, 96, 256) * 256 ** -0.5, _randn(5, 16, 256)
    x[3] *= 150.0
    qweight, scale = quantize_weight(weight)
    got = int8_panel_linear(x, to_int8_panels(qweight, scale))
    exact = F.linear(x, qweight.float() * scale[:, None])
    error = ((got - exact).norm(dim=1) / exact.norm(dim=1))
    assert bool((error > 1e-4).all()) and bool((error < 0.01).all())


@pytest.mark.parametrize("activation", sorted(PANEL_ACTIVATIONS))
@pytest.mark.parametrize("rows", [2, 11])
def test_int8_panel_linear_applies_the_activation_after_the_bias(activation, rows):
    qweight, scale = quantize_weight(_randn(10, 70, 48) * 0.3)
    bias, x = _randn(11, 70), _randn(12, rows, 48)
    function = {"relu": F.relu, "silu": F.silu, "swish": F.silu, "gelu": F.gelu}[activation]
    packed = to_int8_panels(qweight, scale)
    torch.testing.assert_close(int8_panel_linear(x, packed, bias, activation),
                               function(int8_panel_linear(x, packed, bias)), rtol=1e-5, atol=1e-6)


def test_int8_panel_linear_reads_strided_rows_zero_rows_and_no_rows():
    qweight, scale = quantize_weight(_randn(4, 40, 24))
    packed, wide = to_int8_panels(qweight, scale), _randn(5, 11, 60)
    wide[4] = 0.0
    x = wide[:, 10:34]                                   # row stride 60, unit column stride
    got = int8_panel_linear(x, packed)
    torch.testing.assert_close(got.double(), _reference(x.contiguous(), qweight, scale), rtol=1e-6, atol=1e-6)
    assert not got[4].any()
    assert int8_panel_linear(x[:0], packed).shape == (0, 40)


def test_int8_panel_linear_refuses_inputs_that_do_not_fit():
    qweight, scale = quantize_weight(_randn(6, 40, 24))
    packed = to_int8_panels(qweight, scale)
    with pytest.raises(ValueError, match=r"input torch.float32 \(3, 23\)"):
        int8_panel_linear(_randn(7, 3, 23), packed)
    with pytest.raises(ValueError, match="does not fit"):
        int8_panel_linear(_randn(7, 24, 3).t(), packed)               # columns not contiguous
    with pytest.raises(ValueError, match=r"bias must be float32 \[40\]"):
        int8_panel_linear(_randn(7, 3, 24), packed, _randn(8, 39))
    with pytest.raises(ValueError, match="activation 'gelu_new' is not one of"):
        int8_panel_linear(_randn(7, 3, 24), packed, activation="gelu_new")
    with pytest.raises(ValueError, match="2-d int8 weight"):
        to_int8_panels(qweight.float(), scale)
    with pytest.raises(ValueError, match=r"\[-127, 127\]"):
        to_int8_panels(torch.full((2, 4), -128, dtype=torch.int8), torch.ones(2))
