"""Which packing float32 linears get (models/packed_linear.py float32_packing, from the platform's order): at the
AVX-512 and AVX2 levels the panel kernel for decode-step linears where it built; for the others at the AVX-512 level
oneDNN on Intel CPUs and the panels elsewhere, below it oneDNN; the panels for bfloat16 weights whatever the vendor;
SEQ2SEQ_ENGINE_PACKED_LINEAR=panels|onednn|0 forcing one or none for every layer; bad values and missing packings
refused with the variable's name."""
import pytest
import torch

from seq2seq_engine.kernels.native_linear import panel_linear_available
from seq2seq_engine.models import packed_linear
from seq2seq_engine.models.packed_linear import (PACKED_LINEAR_ENV, PackedLinear, float32_packing,
                                                 onednn_linear_available, packed_linear_available)
from seq2seq_engine.platforms.cpu_policy import CpuPlatform
from seq2seq_engine.platforms.cpu_probe import CpuInfo

BOTH = panel_linear_available() and onednn_linear_available()


def _vendor(monkeypatch, vendor, isa="avx512"):
    """The platform of an AVX-512 (or `isa`) CPU of `vendor`, whatever this machine is."""
    info = CpuInfo(vendor, "test CPU", frozenset({"avx2", "fma", "avx512f", "avx512bw", "avx512vl"}), 2 << 20,
                   32 << 20, 2)
    monkeypatch.setattr(packed_linear, "current_platform", lambda: CpuPlatform(info, isa))
    monkeypatch.delenv(PACKED_LINEAR_ENV, raising=False)


@pytest.mark.skipif(not BOTH, reason="needs both the panel kernel and oneDNN")
@pytest.mark.parametrize("vendor,expected", [("GenuineIntel", "onednn"), ("AuthenticAMD", "panels"), ("", "panels")])
def test_the_default_follows_the_cpu_vendor(monkeypatch, vendor, expected):
    _vendor(monkeypatch, vendor)
    assert float32_packing() == expected
    monkeypatch.setenv(PACKED_LINEAR_ENV, "1")
    assert float32_packing() == expected
    layer = PackedLinear(torch.randn(40, 24))
    assert layer.panels == (expected == "panels")
    x = torch.randn(5, 24)
    torch.testing.assert_close(layer(x), x @ layer.weight.T, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not BOTH, reason="needs both the panel kernel and oneDNN")
@pytest.mark.parametrize("vendor", ["GenuineIntel", "AuthenticAMD"])
def test_an_avx2_cpu_takes_the_panels_for_decode_steps_and_bfloat16_weights_else_onednn(monkeypatch, vendor):
    _vendor(monkeypatch, vendor, isa="avx2")
    assert float32_packing() == "onednn" and float32_packing(decode_step=True) == "panels"
    assert float32_packing(bf16_weights=True) == "panels" == float32_packing(True, bf16_weights=True)
    monkeypatch.setenv(PACKED_LINEAR_ENV, "onednn")      # a forced packing wins, even for bfloat16 weights
    assert float32_packing(bf16_weights=True) == "onednn"


@pytest.mark.skipif(not BOTH, reason="needs both the panel kernel and oneDNN")
@pytest.mark.parametrize("vendor", ["GenuineIntel", "AuthenticAMD", ""])
def test_decode_step_linears_take_the_panels_on_every_vendor_unless_forced(monkeypatch, vendor):
    _vendor(monkeypatch, vendor)
    assert float32_packing(decode_step=True) == "panels"
    monkeypatch.setenv(PACKED_LINEAR_ENV, "onednn")
    assert float32_packing(decode_step=True) == "onednn"
    monkeypatch.setenv(PACKED_LINEAR_ENV, "0")
    assert float32_packing(decode_step=True) is None


@pytest.mark.skipif(not onednn_linear_available(), reason="torch built without oneDNN")
def test_decode_step_linears_take_onednn_where_the_panel_kernel_is_missing(monkeypatch):
    monkeypatch.setattr(packed_linear, "panel_linear_available", lambda: False)
    _vendor(monkeypatch, "AuthenticAMD")
    assert float32_packing(decode_step=True) == "onednn"


@pytest.mark.skipif(not onednn_linear_available(), reason="torch built without oneDNN")
def test_an_intel_cpu_without_the_panel_kernel_and_an_amd_one_without_it_both_take_onednn(monkeypatch):
    monkeypatch.setattr(packed_linear, "panel_linear_available", lambda: False)
    for vendor in ("GenuineIntel", "AuthenticAMD"):
        _vendor(monkeypatch, vendor)
        assert float32_packing() == "onednn"
        assert not PackedLinear(torch.randn(8, 8)).panels


@pytest.mark.parametrize("packing", ["panels", "onednn"])
def test_the_variable_forces_a_packing_whatever_the_vendor(monkeypatch, packing):
    available = {"panels": panel_linear_available(), "onednn": onednn_linear_available()}[packing]
    for vendor in ("GenuineIntel", "AuthenticAMD"):
        _vendor(monkeypatch, vendor)
        monkeypatch.setenv(PACKED_LINEAR_ENV, packing.upper())
        if not available:
            with pytest.raises(ValueError, match=f"{PACKED_LINEAR_ENV}={packing}: that packing is not available"):
                float32_packing()
            continue
        assert float32_packing() == packing
        assert PackedLinear(torch.randn(8, 8)).panels == (packing == "panels")


@pytest.mark.parametrize("value", ["0", "off", "False"])
def test_zero_turns_packing_off(monkeypatch, value):
    monkeypatch.setenv(PACKED_LINEAR_ENV, value)
    assert float32_packing() is None and not packed_linear_available()


def test_an_unknown_value_is_refused_with_the_valid_ones(monkeypatch):
    monkeypatch.setenv(PACKED_LINEAR_ENV, "mkl")
    with pytest.raises(ValueError, match=f"{PACKED_LINEAR_ENV} must be 0, 1, panels or onednn, got 'mkl'"):
        float32_packing()
