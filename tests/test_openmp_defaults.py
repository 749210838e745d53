"""The OpenMP defaults are set on package import, before torch loads, and never override the user's setting."""
import os
import subprocess
import sys


def _run(code, **env):
    environment = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    environment.update(env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=environment,
                          timeout=120).stdout.split()


def test_importing_the_package_sets_passive_waiting_before_torch_is_loaded():
    assert _run("import os, sys, seq2seq_engine; print(os.environ['OMP_WAIT_POLICY'], 'torch' in sys.modules)") == \
        ["PASSIVE", "False"]


def test_a_users_setting_wins():
    assert _run("import os, seq2seq_engine; print(os.environ['OMP_WAIT_POLICY'])", OMP_WAIT_POLICY="ACTIVE") == \
        ["ACTIVE"]


def test_apply_reports_whether_torch_was_already_loaded():
    assert _run("import torch\nfrom seq2seq_engine.openmp_defaults import apply_openmp_defaults\n"
                "print(apply_openmp_defaults())") == ["False"]
