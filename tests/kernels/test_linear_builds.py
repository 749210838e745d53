"""The native linear kernels built for other targets than this CPU (SEQ2SEQ_ENGINE_NATIVE_MARCH, in a subprocess:
load_library builds once per process): x86-64-v3 (AVX2 + FMA: the AVX2 panel tiles on float32 and bfloat16 weights
and the exact vpmaddubsw int8 tiles), alderlake (AVX2 + AVX-VNNI: the ymm vpdpbusd int8 tiles) and x86-64 (no SIMD
path: both report "none" and unavailable, so callers keep oneDNN and fbgemm). Each AVX2 build passes the same tests
as this CPU's own build (the bfloat16-weight panels bit for bit against the float32 ones), against F.linear and the
integer reference, and reports its code path."""
import os
import platform
import subprocess
import sys

import pytest
from linear_isa import MARCH_FLAGS, cpu_flags, int8_isa, panel_isa

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TESTS = ["tests/kernels/test_panel_linear.py", "tests/kernels/test_int8_panel_linear.py"]
REPORT = ("from seq2seq_engine.kernels.native_int8 import int8_linear_available, int8_linear_isa\n"
          "from seq2seq_engine.kernels.native_linear import panel_linear_available, panel_linear_isa\n"
          "print(panel_linear_isa(), panel_linear_available(), int8_linear_isa(), int8_linear_available())\n")
x86_only = pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86-64 -march targets")


def _run(march, args, timeout):
    env = dict(os.environ, SEQ2SEQ_ENGINE_NATIVE_MARCH=march)
    return subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def _require_flags(march):
    missing = sorted(MARCH_FLAGS[march] - cpu_flags())
    if missing:
        pytest.skip(f"this CPU cannot run a -march={march} build: it lacks {', '.join(missing)}")


@x86_only
@pytest.mark.parametrize("march", ["x86-64-v3", "alderlake"])
def test_the_linear_kernel_tests_pass_on_an_avx2_build(march):
    _require_flags(march)
    result = _run(march, [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *TESTS], timeout=600)
    summary = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else ""
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert " passed" in summary and "skipped" not in summary and "failed" not in summary, summary


@x86_only
@pytest.mark.parametrize("march", ["x86-64-v3", "alderlake"])
def test_an_avx2_build_reports_its_code_paths(march):
    _require_flags(march)
    result = _run(march, [sys.executable, "-c", REPORT], timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    flags = MARCH_FLAGS[march]
    assert result.stdout.split() == [panel_isa(flags), "True", int8_isa(flags), "True"]
    assert result.stdout.split()[::2] == (["avx2", "avx2"] if march == "x86-64-v3" else ["avx2", "avx_vnni"])


@x86_only
def test_a_build_without_simd_has_no_linear_kernels():
    result = _run("x86-64", [sys.executable, "-c", REPORT], timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["none", "False", "none", "False"]
