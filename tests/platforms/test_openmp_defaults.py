"""The OpenMP defaults are set on package import, before torch loads, and never override the user's setting."""
import os
import subprocess
import sys

PRINT_SETTINGS = ("import os, sys, seq2seq_engine; "
                  "print(os.environ.get('OMP_WAIT_POLICY', '-'), os.environ.get('GOMP_SPINCOUNT', '-'), "
                  "'torch' in sys.modules)")


def _run(code, **env):
    environment = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    environment.update(env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=environment,
                          timeout=120).stdout.split()


def test_importing_the_package_sets_a_short_spin_before_torch_is_loaded():
    assert _run(PRINT_SETTINGS) == ["-", "10000", "False"]


def test_a_users_wait_policy_wins():
    assert _run(PRINT_SETTINGS, OMP_WAIT_POLICY="PASSIVE") == ["PASSIVE", "-", "False"]


def test_a_users_spin_count_wins():
    assert _run(PRINT_SETTINGS, GOMP_SPINCOUNT="0") == ["-", "0", "False"]


def test_apply_reports_whether_torch_was_already_loaded():
    assert _run("import torch\nfrom seq2seq_engine.platforms.openmp import apply_openmp_defaults\n"
                "print(apply_openmp_defaults())") == ["False"]
