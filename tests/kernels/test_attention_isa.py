"""The paged attention kernel reports the code path its build targets (AVX-512 tiles, AVX2 tiles or the portable
loops), so a run of the kernel tests under another -march (test_portable_builds.py) is known to test that path."""
from linear_isa import attention_isa, target_flags

from seq2seq_engine.kernels.native_attention import paged_attention_isa


def test_the_attention_kernel_reports_the_path_its_build_targets():
    assert paged_attention_isa() == attention_isa(target_flags())
