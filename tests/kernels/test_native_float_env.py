"""Loading a native kernel changes no thread's float semantics: -ffast-math's crtfastmath.o sets flush-to-zero in
the loading thread, and load_library undoes it unless the thread flushed already (each case in a fresh interpreter,
whose threads start with IEEE semantics)."""
import subprocess
import sys

import pytest

from seq2seq_engine.kernels.native import load_library

pytestmark = pytest.mark.skipif(load_library("panel_linear_cpu") is None, reason="no native kernels here")

CHECK = """
import threading, torch
from seq2seq_engine.kernels.native import flushes_denormals, load_library
if {flush_first}:
    torch.set_flush_denormal(True)
before = flushes_denormals()
load_library("panel_linear_cpu")
seen = []
worker = threading.Thread(target=lambda: seen.append(flushes_denormals()))
worker.start()
worker.join()
print(before, flushes_denormals(), seen[0], (torch.tensor([1e-39]) * 1.0).item() == 0.0)
"""


@pytest.mark.parametrize("flush_first", [False, True])
def test_loading_a_kernel_keeps_the_threads_float_semantics(flush_first):
    out = subprocess.run([sys.executable, "-c", CHECK.format(flush_first=flush_first)], check=True,
                         capture_output=True, text=True).stdout.split()
    assert out == [str(flush_first)] * 4
