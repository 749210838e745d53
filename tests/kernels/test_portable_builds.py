"""The native kernels compiled for an AVX2 CPU (SEQ2SEQ_ENGINE_NATIVE_MARCH=x86-64-v3) on this machine: their portable
loops pass the same kernel tests as the AVX-512 build, and the AVX-512-only linear kernels report themselves
unavailable, so float32 layers keep oneDNN and int8 layers fbgemm."""
import os
import subprocess
import sys

import pytest

from seq2seq_engine.kernels import native

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
AVX2_BUILD = dict(os.environ, SEQ2SEQ_ENGINE_NATIVE_MARCH="x86-64-v3")


def _run(args, timeout):
    return subprocess.run(args, cwd=ROOT, env=AVX2_BUILD, capture_output=True, text=True, timeout=timeout)


def test_kernel_tests_pass_on_an_avx2_build():
    result = _run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/kernels/test_kernels.py",
                   "tests/kernels/test_fused_ops.py", "tests/kernels/test_greedy.py",
                   "tests/kernels/test_position_bias.py"], timeout=600)
    summary = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else ""
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert " passed" in summary and "skipped" not in summary and "failed" not in summary, summary


def test_avx512_linear_kernels_are_unavailable_on_an_avx2_build():
    code = ("import torch\n"
            "from seq2seq_engine.kernels.native import load_library\n"
            "from seq2seq_engine.kernels.native_int8 import int8_linear_available\n"
            "from seq2seq_engine.kernels.native_linear import panel_linear_available\n"
            "from seq2seq_engine.models.int8 import Int8Linear\n"
            "from seq2seq_engine.models.packed_linear import PackedLinear\n"
            "assert load_library('panel_linear_cpu') is not None and load_library('int8_linear_cpu') is not None\n"
            "print(panel_linear_available(), int8_linear_available(), PackedLinear(torch.randn(8, 8)).panels,\n"
            "      Int8Linear(torch.randn(8, 8)).native)\n")
    result = _run([sys.executable, "-c", code], timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["False"] * 4


def test_a_march_value_that_is_not_one_is_refused(monkeypatch):
    monkeypatch.setenv(native.MARCH_ENV, "native -o /tmp/x")
    native.load_library.cache_clear()
    try:
        with pytest.raises(ValueError, match="SEQ2SEQ_ENGINE_NATIVE_MARCH must be a compiler -march value"):
            native.load_library("greedy_cpu")
    finally:
        native.load_library.cache_clear()
