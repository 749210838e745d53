"""The native int8 panel kernel (kernels/native_int8.py, csrc/int8_linear_cpu.c) against a float64 reference of the
same arithmetic on random inputs: rows rounded to int8 on their own max |x| / 127 grid, exact integer products, then
the row and column scales and the bias. Every row-tile size, widths off the 32-column panel and depths off the
4-channel group, strided rows, zero rows, activations, the packing and its errors. The integer sums are checked
exactly (a pair of 8-bit products at its largest included, which would saturate vpmaddubsw's int16 on the unsigned
q + 128), whichever code path is built: AVX-512 VNNI, AVX-VNNI or AVX2, the one this CPU's flags (or
SEQ2SEQ_ENGINE_NATIVE_MARCH's target, test_linear_builds.py) call for."""

import pytest
import torch
import torch.nn.functional as F
from linear_isa import int8_isa, target_flags

from seq2seq_engine.kernels.native_int8 import (GROUP, int8_linear_available, int8_linear_isa, int8_panel_linear,
                                                to_int8_panels, unpack_int8_panels)
from seq2seq_engine.kernels.native_linear import PANEL_ACTIVATIONS, PANEL_WIDTH
from seq2seq_engine.models.int8 import quantize_weight

needs_kernel = pytest.mark.skipif(not int8_linear_available(), reason="no int8 kernel here: the CPU has no AVX2")


def _randn(seed, *shape):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _reference(x, qweight, scale, bias=None):
    """float64 (x_q W_q^T) * row_scale * scale + bias, x_q = round(x * 127 / max|x_row|) as the kernel rounds it."""
    amax = x.abs().amax(dim=1, keepdim=True)
    inverse = torch.where(amax > 0, 127.0 / amax, torch.zeros_like(amax))        # float32, as in the kernel
    x_q = torch.round(x * inverse).clamp(-127, 127).double()
    out = (x_q @ qweight.double().t()) * (amax.double() / 127) * scale.double()
    return out if bias is None else out + bias.double()


def _integer_sums(x, qweight):
    """The exact int64 sums x_q W_q^T of the kernel's quantization, and the row scales max |x_row| / 127."""
    amax = x.abs().amax(dim=1, keepdim=True)
    inverse = torch.where(amax > 0, 127.0 / amax, torch.zeros_like(amax))
    x_q = torch.round(x * inverse).clamp(-127, 127).long()
    return x_q @ qweight.long().t(), amax.double() / 127


def test_the_build_reports_the_code_path_of_its_target():
    flags = target_flags()
    assert int8_linear_isa() == int8_isa(flags)
    assert int8_linear_available() == (int8_isa(flags) != "none")


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


@needs_kernel
@pytest.mark.parametrize("rows", [1, 2, 3, 8, 9, 13, 17, 64, 100, 131])
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


@needs_kernel
@pytest.mark.parametrize("rows", [1, 3, 8, 13, 64, 100])
@pytest.mark.parametrize("out_features,in_features", [(45, 37), (300, 258)])
def test_int8_panel_linear_sums_the_8_bit_products_exactly(rows, out_features, in_features):
    """The outputs over row scale x column scale are the int64 sums of the same quantization: float rounding moves
    them by far less than the 0.5 that one unit of a sum would."""
    qweight, scale = quantize_weight(_randn(20, out_features, in_features))
    wide = _randn(21, rows, in_features + 9) * torch.logspace(-2, 2, rows)[:, None]
    x = wide[:, 5:5 + in_features]                       # strided rows
    sums, row_scale = _integer_sums(x, qweight)
    got = int8_panel_linear(x, to_int8_panels(qweight, scale)).double() / (row_scale * scale.double())
    assert (got - sums).abs().max().item() < 0.05
    assert torch.equal(got.round().long(), sums)


@needs_kernel
def test_int8_panel_linear_does_not_saturate_on_the_largest_products():
    """Every q and w at +-127 with equal or opposite signs: each pair of products is +-32258, which the unsigned
    q + 128 (255 x 127 x 2) would take past int16."""
    signs = torch.where(_randn(22, 70, 65) > 0, 1, -1)
    qweight = (signs * 127).to(torch.int8)
    x = torch.cat([signs[:3].float(), -signs[3:6].float(), torch.ones(1, 65)]) * 0.5     # rows 3..5: opposite signs
    got = int8_panel_linear(x, to_int8_panels(qweight, torch.ones(70)))
    sums, row_scale = _integer_sums(x, qweight)
    assert torch.equal(sums[:3, :3].diagonal(), torch.full((3,), 65 * 127 * 127))
    assert torch.equal(sums[3:6, 3:6].diagonal(), torch.full((3,), -65 * 127 * 127))
    assert torch.equal((got.double() / row_scale).round().long(), sums)


@needs_kernel
def test_int8_panel_linear_quantizes_activations_to_127_levels_per_row():
    """Its error against the unquantized float product is that of 8-bit rows: above zero, below 1%."""
    weight, x = _randn(4, 96, 256) * 256 ** -0.5, _randn(5, 16, 256)
    x[3] *= 150.0
    qweight, scale = quantize_weight(weight)
    got = int8_panel_linear(x, to_int8_panels(qweight, scale))
    exact = F.linear(x, qweight.float() * scale[:, None])
    error = ((got - exact).norm(dim=1) / exact.norm(dim=1))
    assert bool((error > 1e-4).all()) and bool((error < 0.01).all())


@needs_kernel
@pytest.mark.parametrize("activation", sorted(PANEL_ACTIVATIONS))
@pytest.mark.parametrize("rows", [1, 2, 3, 8, 11, 13, 64, 100])
@pytest.mark.parametrize("bias", [False, True])
def test_int8_panel_linear_applies_the_activation_after_the_bias(activation, rows, bias):
    qweight, scale = quantize_weight(_randn(10, 70, 47) * 0.3)
    b, x = _randn(11, 70) if bias else None, _randn(12, rows, 47)
    function = {"relu": F.relu, "silu": F.silu, "swish": F.silu, "gelu": F.gelu}[activation]
    expected = function(_reference(x, qweight, scale, b).float())
    torch.testing.assert_close(int8_panel_linear(x, to_int8_panels(qweight, scale), b, activation), expected,
                               rtol=1e-5, atol=1e-5)


@needs_kernel
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
