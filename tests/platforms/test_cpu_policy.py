"""The CPU platform's policy table (seq2seq_engine/platforms/cpu_policy.py) on the CPU kinds this project runs on, the
SEQ2SEQ_ENGINE_CPU_ISA cap and the overrides it reads."""
import dataclasses
import subprocess
import sys

import pytest

from seq2seq_engine.platforms.cpu_policy import (CAPPED_MARCH, INT8_BF16_ATTENTION_ENV, ISA_ENV, MARCH_ENV,
                                                 PACKED_LINEAR_ENV, CpuPlatform, detected_isa)
from seq2seq_engine.platforms.cpu_probe import AMD, INTEL, CpuInfo

AVX512 = {"avx2", "fma", "avx512f", "avx512bw", "avx512vl"}
ZEN4 = CpuInfo(AMD, "AMD EPYC Zen 4", frozenset(AVX512 | {"avx512_bf16", "avx512_vnni"}), 1 << 20, 32 << 20, 2)
XEON_AMX = CpuInfo(INTEL, "Xeon", frozenset(AVX512 | {"avx512_vnni", "amx_tile", "amx_bf16", "amx_int8"}),
                   2 << 20, 105 << 20, 2)
EPYC_AVX2 = CpuInfo(AMD, "AMD EPYC Zen 3", frozenset({"avx2", "fma"}), 2 << 20, 32 << 20, 2)
ALDER_LAKE = CpuInfo(INTEL, "Core i7-12700", frozenset({"avx2", "fma", "avx_vnni"}), 1 << 20, 25 << 20, 2)
OLD = CpuInfo("", "", frozenset({"sse4_2"}), 0, 0, 1)


@pytest.fixture(autouse=True)
def _no_overrides(monkeypatch):
    for name in (ISA_ENV, MARCH_ENV, PACKED_LINEAR_ENV, INT8_BF16_ATTENTION_ENV, "FBGEMM_ENABLE_INSTRUCTIONS"):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize("info, isa, bf16, dot, reduced", [
    (ZEN4, "avx512", True, "avx512_vnni", False), (XEON_AMX, "avx512", True, "avx512_vnni", False),
    (EPYC_AVX2, "avx2", False, "avx2", True), (ALDER_LAKE, "avx2", False, "avx_vnni", True),
    (OLD, "portable", False, "none", True)])
def test_each_cpu_kind_gets_its_level_bf16_and_int8_paths(info, isa, bf16, dot, reduced):
    platform = CpuPlatform.from_cpu(info)
    assert (detected_isa(info), platform.isa, platform.native_bf16) == (isa, isa, bf16)
    assert (platform.int8_dot, platform.fbgemm_needs_reduced_range) == (dot, reduced)
    assert platform.compute_dtype("bfloat16") == ("bfloat16" if bf16 else "float32")
    assert platform.compute_dtype("float32") == "float32" and platform.native_march() == "native"


def test_float32_linear_orders_follow_role_vendor_and_level():
    for info in (XEON_AMX, ALDER_LAKE, EPYC_AVX2, OLD):   # oneDNN first over many rows: Intel, and below AVX-512
        assert CpuPlatform.from_cpu(info).float32_linear_order("other") == ("onednn", "panels", "torch")
    assert CpuPlatform.from_cpu(ZEN4).float32_linear_order("other") == ("panels", "onednn", "torch")
    for info in (ZEN4, XEON_AMX, EPYC_AVX2, ALDER_LAKE, OLD):
        assert CpuPlatform.from_cpu(info).float32_linear_order("decode_step") == ("panels", "onednn", "torch")
    with pytest.raises(ValueError, match="linear role must be one of"):
        CpuPlatform.from_cpu(ZEN4).float32_linear_order("prefill")


@pytest.mark.parametrize("value, order", [("0", ("torch",)), ("off", ("torch",)), ("panels", ("panels",)),
                                          ("ONEDNN", ("onednn",)), ("1", ("panels", "onednn", "torch"))])
def test_the_packed_linear_override_is_read_by_the_table(monkeypatch, value, order):
    monkeypatch.setenv(PACKED_LINEAR_ENV, value)
    assert CpuPlatform.from_cpu(ZEN4).float32_linear_order("decode_step") == order
    monkeypatch.setenv(PACKED_LINEAR_ENV, "mkl")
    with pytest.raises(ValueError, match=f"{PACKED_LINEAR_ENV} must be 0, 1, panels or onednn, got 'mkl'"):
        CpuPlatform.from_cpu(ZEN4).float32_linear_order("other")


@pytest.mark.parametrize("cap", ["avx2", "portable"])
def test_the_isa_cap_lowers_the_level_never_raises_it(monkeypatch, cap):
    monkeypatch.setenv(ISA_ENV, cap.upper())
    zen4 = CpuPlatform.from_cpu(ZEN4)
    assert zen4.isa == cap and not zen4.native_bf16 and zen4.compute_dtype("bfloat16") == "float32"
    assert zen4.native_march() == CAPPED_MARCH[cap] and zen4.fbgemm_needs_reduced_range
    assert CpuPlatform.from_cpu(OLD).isa == "portable"
    monkeypatch.setenv(MARCH_ENV, "znver4")          # an explicit -march wins over the cap's
    assert zen4.native_march() == "znver4"


def test_a_cap_at_avx2_leaves_avx_vnni_out_as_the_x86_64_v3_build_does(monkeypatch):
    monkeypatch.setenv(ISA_ENV, "avx2")
    assert CpuPlatform.from_cpu(ALDER_LAKE).int8_dot == "avx2"
    assert CpuPlatform.from_cpu(ZEN4).int8_dot == "avx2"


def test_fbgemm_held_below_vnni_needs_7_bit_activations(monkeypatch):
    monkeypatch.setenv("FBGEMM_ENABLE_INSTRUCTIONS", "avx2")
    assert CpuPlatform.from_cpu(ZEN4).fbgemm_needs_reduced_range


def test_a_bad_cap_is_refused_with_the_levels(monkeypatch):
    monkeypatch.setenv(ISA_ENV, "sse")
    with pytest.raises(ValueError, match=f"{ISA_ENV} must be auto, avx512, avx2, portable, got 'sse'"):
        CpuPlatform.from_cpu(ZEN4)


def test_the_cap_reaches_the_libraries_when_set_before_the_engine_is_imported():
    code = ("import os, seq2seq_engine, torch; print(os.environ['ONEDNN_MAX_CPU_ISA'], "
            "os.environ['FBGEMM_ENABLE_INSTRUCTIONS'], torch.backends.cpu.get_cpu_capability())")
    env = {"PATH": "/usr/bin:/bin", ISA_ENV: "avx2"}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split()[:2] == ["AVX2", "AVX2"]
    assert result.stdout.split()[2] in ("AVX2", "DEFAULT")     # never above the cap


def test_an_int8_models_encoder_attends_in_bfloat16_only_where_bf16_attention_is_faster(monkeypatch):
    for info in (ZEN4, XEON_AMX, EPYC_AVX2, ALDER_LAKE, OLD):
        platform = CpuPlatform.from_cpu(info)
        assert platform.encoder_attention_dtype("int8") == ("bfloat16" if platform.native_bf16 else "float32")
        assert platform.encoder_attention_dtype(None) == "float32"  # float32 models keep float32 (HF parity)
    xeon_without_amx = dataclasses.replace(XEON_AMX, flags=frozenset(AVX512 | {"avx512_vnni", "avx512_bf16"}))
    assert CpuPlatform.from_cpu(xeon_without_amx).native_bf16
    assert CpuPlatform.from_cpu(xeon_without_amx).encoder_attention_dtype("int8") == "float32"
    monkeypatch.setenv(INT8_BF16_ATTENTION_ENV, "0")
    assert CpuPlatform.from_cpu(ZEN4).encoder_attention_dtype("int8") == "float32"
    monkeypatch.setenv(INT8_BF16_ATTENTION_ENV, "1")
    monkeypatch.setenv(ISA_ENV, "avx2")
    assert CpuPlatform.from_cpu(XEON_AMX).encoder_attention_dtype("int8") == "float32"
