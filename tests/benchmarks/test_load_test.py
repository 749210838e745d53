"""benchmarks/load_test.py in small: many requests through a KV pool a tenth of their need must preempt, give the
same outputs as an unconstrained run and return every block (throughput is not checked here: see the benchmark)."""
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.parametrize("arch,mode", [("llama", "recompute"), ("bart", "swap")])
def test_constrained_pool_preempts_and_matches_the_unconstrained_run(arch, mode):
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.load_test", "--arch", arch, "--preemption-mode", mode,
         "--num-requests", "60", "--max-prompt", "64", "--max-new", "24", "--pool-fraction", "0.1",
         "--max-num-seqs", "32", "--min-ratio", "0", "--threads", "1"],
        capture_output=True, text=True, timeout=600, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "identical outputs: 60/60" in result.stdout and "all blocks returned: True" in result.stdout
    preemptions = int(re.search(r"\| constrained \| \d+ \| [\d.]+ \| [\d.]+ \| (\d+) \|", result.stdout).group(1))
    assert preemptions > 0
