"""The KV pools: CPU pools are zero, writable, and cost resident memory only for the blocks written."""
import pytest
import torch

from seq2seq_engine.platforms.cpu_memory import tune_malloc
from seq2seq_engine.worker.cache_engine import CacheEngine, lazy_zeros

MIB = 1 << 20


def resident_bytes() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    pytest.skip("no VmRSS in /proc/self/status on this system")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_lazy_zeros_is_a_zero_tensor_of_the_shape_and_dtype(dtype):
    shape = (7, 16, 3, 10)
    tensor = lazy_zeros(shape, dtype)
    assert tensor.shape == shape and tensor.dtype == dtype and tensor.is_contiguous()
    assert not tensor.any()
    values = torch.randn(shape).to(dtype)
    tensor.copy_(values)
    assert torch.equal(tensor, values)


def test_a_cpu_pool_costs_memory_for_the_blocks_written_not_its_size():
    # 6 layers x (K, V) x 1024 blocks x 16 x 8 x 64 float32 = 384 MiB of pool, 32 MiB per tensor.
    tune_malloc()  # as in an engine: tensors of this size would come from the (recycled) heap
    before = resident_bytes()
    engine = CacheEngine(num_layers=6, num_kv_heads=8, head_size=64, block_size=16, num_gpu_blocks=1024,
                         num_cpu_blocks=256, dtype=torch.float32, device=torch.device("cpu"))
    after_allocation = resident_bytes()
    assert after_allocation - before < 32 * MIB, "allocating the pool committed its memory"
    for key_cache, value_cache in engine.device_cache:
        assert not key_cache[:3].any() and not value_cache[-3:].any()  # reads of unwritten blocks are zero
        key_cache[:64].normal_()   # 64 blocks of 32 KiB per tensor: 2 MiB each, 24 MiB in all
        value_cache[:64].normal_()
    grown = resident_bytes() - after_allocation
    assert 16 * MIB < grown < 64 * MIB, f"writing 24 MiB of blocks grew the resident set by {grown / MIB:.0f} MiB"


def test_swap_and_copy_move_blocks_between_lazy_pools():
    engine = CacheEngine(num_layers=2, num_kv_heads=2, head_size=8, block_size=4, num_gpu_blocks=8,
                         num_cpu_blocks=4, dtype=torch.float32, device=torch.device("cpu"))
    key_cache, value_cache = engine.device_cache[1]
    key_cache[5].normal_()
    value_cache[5].normal_()
    expected_key, expected_value = key_cache[5].clone(), value_cache[5].clone()
    engine.swap_out([(5, 2)])
    key_cache[5].zero_()
    engine.swap_in([(2, 6)])
    engine.copy([(6, 0)])
    assert torch.equal(key_cache[6], expected_key) and torch.equal(value_cache[0], expected_value)


def test_an_empty_pool_is_allowed():
    engine = CacheEngine(num_layers=2, num_kv_heads=2, head_size=8, block_size=4, num_gpu_blocks=8,
                         num_cpu_blocks=0, dtype=torch.float32, device=torch.device("cpu"))
    assert all(key.shape[0] == 0 and value.shape[0] == 0 for key, value in engine.cpu_cache)
