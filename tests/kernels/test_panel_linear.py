"""The native panel linear kernel (kernels/native_linear.py, csrc/panel_linear_cpu.c) against F.linear on random
inputs: every row-tile size of its AVX-512 and AVX2 tiles, output widths off the 32-column panel, odd depths, strided
rows, with and without bias, each activation; a row's result does not depend on how many rows share the call. Its
bfloat16-weight panels give the float32 kernel's bits on the weight rounded to bfloat16. The code path built is the
one this CPU's flags (or SEQ2SEQ_ENGINE_NATIVE_MARCH's target, test_linear_builds.py) call for."""

import pytest
import torch
import torch.nn.functional as F
from linear_isa import panel_isa, target_flags

from seq2seq_engine.kernels.native_linear import (PANEL_ACTIVATIONS, PANEL_WIDTH, panel_linear, panel_linear_available,
                                                  panel_linear_isa, to_panels)

needs_kernel = pytest.mark.skipif(not panel_linear_available(),
                                  reason="no panel kernel here: the CPU has neither AVX-512F nor AVX2 + FMA")
ROWS = [1, 2, 3, 6, 8, 9, 13, 17, 64, 100, 131]


def _randn(seed, *shape):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def test_to_panels_lays_out_column_panels_padded_with_zeros():
    weight = _randn(0, 37, 5)
    panels = to_panels(weight)
    assert panels.shape == (2, 5, PANEL_WIDTH) and panels.is_contiguous()
    assert torch.equal(panels[1, :, :5], weight[32:].t()) and not panels[1, :, 5:].any()
    assert torch.equal(panels[0], weight[:32].t())


def test_bfloat16_panels_hold_the_weight_rounded_as_torch_rounds_it():
    weight = _randn(0, 37, 5)
    rounded = weight.to(torch.bfloat16)
    for source in (weight, rounded):
        panels = to_panels(source, dtype=torch.bfloat16)
        assert panels.dtype == torch.bfloat16 and panels.shape == (2, 5, PANEL_WIDTH) and panels.is_contiguous()
        assert torch.equal(panels[0], rounded[:32].t()) and torch.equal(panels[1, :, :5], rounded[32:].t())
        assert not panels[1, :, 5:].any()
    assert torch.equal(to_panels(rounded), to_panels(rounded.float()))


def test_the_build_reports_the_code_path_of_its_target():
    flags = target_flags()
    assert panel_linear_isa() == panel_isa(flags)
    assert panel_linear_available() == (panel_isa(flags) != "none")


@needs_kernel
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("out_features,in_features", [(1, 7), (31, 16), (32, 33), (45, 64), (80, 40), (300, 257)])
@pytest.mark.parametrize("bias", [False, True])
def test_panel_linear_matches_f_linear(rows, out_features, in_features, bias):
    weight, x = _randn(1, out_features, in_features), _randn(2, rows, in_features)
    b = _randn(3, out_features) if bias else None
    got = panel_linear(x, to_panels(weight), out_features, b)
    assert got.shape == (rows, out_features) and got.is_contiguous()
    torch.testing.assert_close(got, F.linear(x.double(), weight.double(), None if b is None else b.double()).float(),
                               rtol=1e-5, atol=1e-5 * in_features ** 0.5)


@needs_kernel
@pytest.mark.parametrize("rows", [1, 3, 8, 13, 64, 100])
@pytest.mark.parametrize("out_features,in_features", [(80, 33), (300, 257)])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("activation", [None, "relu", "silu", "gelu"])
@pytest.mark.parametrize("strided", [False, True])
def test_bfloat16_panels_give_the_float32_kernels_bits_on_the_rounded_weight(rows, out_features, in_features, bias,
                                                                             activation, strided):
    """The bfloat16 tiles widen each weight vector exactly and sum as the float32 tiles do."""
    weight, b = _randn(20, out_features, in_features), _randn(21, out_features) if bias else None
    wide = _randn(22, rows, in_features + 9)
    x = wide[:, 5:5 + in_features] if strided else wide[:, 5:5 + in_features].contiguous()
    widened = weight.to(torch.bfloat16).float()
    got = panel_linear(x, to_panels(weight, dtype=torch.bfloat16), out_features, b, activation)
    assert got.dtype == torch.float32 and got.shape == (rows, out_features)
    assert torch.equal(got, panel_linear(x, to_panels(widened), out_features, b, activation))
    expected = F.linear(x.double(), widened.double(), None if b is None else b.double()).float()
    function = {None: lambda y: y, "relu": F.relu, "silu": F.silu, "gelu": F.gelu}[activation]
    torch.testing.assert_close(got, function(expected), rtol=1e-5, atol=1e-5 * in_features ** 0.5)


@needs_kernel
@pytest.mark.parametrize("out_features", [45, 96, 300])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_rows_output_is_the_same_bits_in_every_batch_size(out_features, dtype):
    """With AVX-512 few rows run in 8 x 32 tiles and many in 6 x 64 tiles, with AVX2 in 3 x 32 tiles and their
    1- and 2-row copies: all sum over K in the same order, so a request's tokens do not depend on how many others
    share its step."""
    weight, bias, x = _randn(13, out_features, 200), _randn(14, out_features), _randn(15, 131, 200)
    panels = to_panels(weight, dtype=dtype)
    together = panel_linear(x, panels, out_features, bias)
    for first in range(0, 131, 5):
        alone = panel_linear(x[first:first + 5], panels, out_features, bias)
        assert torch.equal(alone, together[first:first + 5]), f"rows {first}..{first + 4} changed with the batch"


@needs_kernel
@pytest.mark.parametrize("activation", sorted(PANEL_ACTIVATIONS))
@pytest.mark.parametrize("rows", [1, 2, 3, 8, 11, 13, 64, 100])
@pytest.mark.parametrize("bias", [False, True])
def test_panel_linear_applies_the_activation_after_the_bias(activation, rows, bias):
    weight, b, x = _randn(10, 70, 47) * 0.3, _randn(11, 70) if bias else None, _randn(12, rows, 47)
    function = {"relu": F.relu, "silu": F.silu, "swish": F.silu, "gelu": F.gelu}[activation]
    torch.testing.assert_close(panel_linear(x, to_panels(weight), 70, b, activation),
                               function(F.linear(x, weight, b)), rtol=1e-5, atol=1e-5)


@needs_kernel
@pytest.mark.parametrize("rows", [1, 3, 8, 13, 64, 100])
@pytest.mark.parametrize("activation", [None, "gelu"])
def test_panel_linear_reads_strided_rows_in_every_tile_size(rows, activation):
    weight, bias, wide = _randn(16, 100, 33), _randn(17, 100), _randn(18, rows, 80)
    x = wide[:, 7:40]                                    # row stride 80, unit column stride, odd K
    expected = F.linear(x.double(), weight.double(), bias.double()).float()
    expected = expected if activation is None else F.gelu(expected)
    torch.testing.assert_close(panel_linear(x, to_panels(weight), 100, bias, activation), expected,
                               rtol=1e-5, atol=1e-5)


@needs_kernel
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
    with pytest.raises(ValueError, match="2-d float32 or bfloat16 weight"):
        to_panels(_randn(9, 4, 4).double())
    with pytest.raises(ValueError, match="panels are float32 or bfloat16, not torch.float16"):
        to_panels(_randn(9, 4, 4), dtype=torch.float16)
    with pytest.raises(ValueError, match="does not fit torch.float16 panels"):
        panel_linear(_randn(7, 3, 24), panels.half(), 40)
    with pytest.raises(ValueError, match="activation 'gelu_new' is not one of"):
        panel_linear(_randn(7, 3, 24), panels, 40, activation="gelu_new")
