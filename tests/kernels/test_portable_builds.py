"""The native kernels compiled for an AVX2 CPU (SEQ2SEQ_ENGINE_NATIVE_MARCH=x86-64-v3) on this machine: their portable
loops pass the same kernel tests as the AVX-512 build (the linear kernels' AVX2 builds: test_linear_builds.py)."""
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


def test_a_march_value_that_is_not_one_is_refused(monkeypatch):
    monkeypatch.setenv(native.MARCH_ENV, "native -o /tmp/x")
    native.load_library.cache_clear()
    try:
        with pytest.raises(ValueError, match="SEQ2SEQ_ENGINE_NATIVE_MARCH must be a compiler -march value"):
            native.load_library("greedy_cpu")
    finally:
        native.load_library.cache_clear()
