"""CPU memory tuning: glibc mallopt settings and the default per-step token budget on the CPU."""
import ctypes
import ctypes.util
import subprocess
import sys

import pytest
from transformers import BartConfig, LlamaConfig, WhisperConfig

from seq2seq_engine.engine.arg_utils import EngineArgs
from seq2seq_engine.platforms.cpu_memory import (DEFAULT_MAX_BATCHED_TOKENS, MALLOC_ENV, MMAP_THRESHOLD_MAX,
                                                 cpu_max_batched_tokens, widest_activation)
from seq2seq_engine.platforms.cuda import CUDA_MAX_BATCHED_TOKENS

CONFIGS = {
    "bart-base": BartConfig(d_model=768, encoder_ffn_dim=3072, decoder_ffn_dim=3072),
    "whisper-base": WhisperConfig(d_model=512, encoder_ffn_dim=2048, decoder_ffn_dim=2048),
    "smollm2": LlamaConfig(hidden_size=576, intermediate_size=1536),
}


def test_widest_activation_reads_each_family_width():
    assert widest_activation(CONFIGS["bart-base"]) == 3072
    assert widest_activation(CONFIGS["whisper-base"]) == 2048
    assert widest_activation(CONFIGS["smollm2"]) == 2 * 1536  # fused gate/up output


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("longest_prefill", [10, 2048, 20000])
def test_cpu_budget_fits_the_mmap_threshold_or_the_longest_prefill(name, longest_prefill):
    config = CONFIGS[name]
    budget = cpu_max_batched_tokens(config, longest_prefill)
    assert budget >= longest_prefill
    assert budget <= max(DEFAULT_MAX_BATCHED_TOKENS, longest_prefill)
    if budget > longest_prefill:  # limited by memory: the widest float32 activation fits, one more token would not
        width_bytes = 4 * widest_activation(config)
        assert budget * width_bytes <= MMAP_THRESHOLD_MAX or budget == DEFAULT_MAX_BATCHED_TOKENS
        assert (budget + 1) * width_bytes > MMAP_THRESHOLD_MAX or budget == DEFAULT_MAX_BATCHED_TOKENS


def test_engine_args_default_budget_depends_on_the_device(tmp_path):
    config = CONFIGS["bart-base"]
    config.save_pretrained(tmp_path)
    cpu = EngineArgs(model=str(tmp_path), device="cpu", skip_tokenizer_init=True).create_engine_config(config)
    longest = cpu.model_config.max_model_len + cpu.model_config.max_encoder_len
    assert cpu.scheduler_config.max_num_batched_tokens == cpu_max_batched_tokens(config, longest)
    assert cpu.scheduler_config.max_num_batched_tokens < DEFAULT_MAX_BATCHED_TOKENS
    explicit = EngineArgs(model=str(tmp_path), device="cpu", skip_tokenizer_init=True,
                          max_num_batched_tokens=5000).create_engine_config(config)
    assert explicit.scheduler_config.max_num_batched_tokens == 5000
    gpu = EngineArgs(model=str(tmp_path), device="cuda", skip_tokenizer_init=True).create_engine_config(config)
    assert gpu.scheduler_config.max_num_batched_tokens == max(CUDA_MAX_BATCHED_TOKENS, longest) == 32768


_PROBE = """
import ctypes, ctypes.util, resource
from seq2seq_engine.platforms.cpu_memory import tune_malloc
applied = tune_malloc()
# After tuning, a freed 20 MB block is reused in place (heap), instead of being unmapped and mapped again; so is a
# 64 MB one (above the largest mmap threshold: the size of a decode step's logits over a 58k vocabulary). Reused
# memory is written again without page faults; fresh pages fault once per 4 KiB page.
libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
def reused(size):
    first = libc.malloc(size); ctypes.memset(first, 1, size); libc.free(first)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    second = libc.malloc(size); ctypes.memset(second, 1, size)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    libc.free(second)
    return faults < size // 4096 // 16
print(applied, reused(20 << 20), reused(64 << 20))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc mallopt")
@pytest.mark.parametrize("setting,expected", [(None, "True True True"), ("0", "False")])
def test_tune_malloc_applies_unless_disabled(setting, expected, monkeypatch):
    if setting is None:
        monkeypatch.delenv(MALLOC_ENV, raising=False)
    else:
        monkeypatch.setenv(MALLOC_ENV, setting)
    out = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, check=True).stdout.split()
    assert " ".join(out[: len(expected.split())]) == expected
    assert ctypes.util.find_library("c")


_TRIM_PROBE = """
import ctypes, ctypes.util
from seq2seq_engine.platforms.cpu_memory import release_free_memory
libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
def resident_mib():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) // 1024 for line in status if line.startswith("VmRSS:"))
# 3000 heap chunks of 64 KiB (under the mmap threshold), written, then all freed but the last: the live chunk at
# the top of the heap keeps glibc's automatic trimming from returning the free space below it.
chunks = [libc.malloc(64 << 10) for _ in range(3000)]
for chunk in chunks:
    ctypes.memset(chunk, 1, 64 << 10)
for chunk in chunks[:-1]:
    libc.free(chunk)
before = resident_mib()
applied = release_free_memory()
print(applied, before - resident_mib())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc_trim")
def test_release_free_memory_returns_freed_heap_pages():
    out = subprocess.run([sys.executable, "-c", _TRIM_PROBE], capture_output=True, text=True, check=True).stdout
    applied, released_mib = out.split()
    assert applied == "True"
    assert int(released_mib) > 150, f"only {released_mib} MiB of ~187 MiB of free heap were returned"
