"""The native kernels compiled for an AVX2 CPU (SEQ2SEQ_ENGINE_NATIVE_MARCH=x86-64-v3: the AVX2 attention tiles) and
for one without AVX2 (x86-64-v2: the portable loops) on this machine pass the same kernel tests as the native build
(the linear kernels' builds: test_linear_builds.py)."""
import os
import subprocess
import sys

import pytest

from seq2seq_engine.kernels import native

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run(args, timeout, march):
    env = dict(os.environ, SEQ2SEQ_ENGINE_NATIVE_MARCH=march)
    return subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("march", ["x86-64-v3", "x86-64-v2"])
def test_kernel_tests_pass_on_avx2_and_portable_builds(march):
    result = _run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/kernels/test_kernels.py",
                   "tests/kernels/test_fused_ops.py", "tests/kernels/test_greedy.py",
                   "tests/kernels/test_position_bias.py", "tests/kernels/test_attention_isa.py"],
                  timeout=600, march=march)
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
