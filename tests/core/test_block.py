"""The block allocator of one device pool (seq2seq_engine.core.block): lowest numbers first, reference counts,
double frees and foreign blocks refused."""
import pytest
from block_manager_utils import BLOCK_SIZE

from seq2seq_engine.core.block import BlockAllocator, Device


def test_allocator_hands_out_lowest_numbers_and_refcounts():
    alloc = BlockAllocator(Device.GPU, BLOCK_SIZE, 3)
    a, b = alloc.allocate(), alloc.allocate()
    assert (a.block_number, b.block_number) == (0, 1)
    assert a.ref_count == b.ref_count == 1
    assert alloc.get_num_free_blocks() == 1
    a.ref_count += 1
    alloc.free(a)
    assert alloc.get_num_free_blocks() == 1  # still referenced once
    alloc.free(a)
    assert alloc.get_num_free_blocks() == 2
    with pytest.raises(ValueError):
        alloc.free(a)  # double free
    alloc.allocate()
    alloc.allocate()
    with pytest.raises(RuntimeError):
        alloc.allocate()


def test_allocator_rejects_foreign_block():
    gpu = BlockAllocator(Device.GPU, BLOCK_SIZE, 2)
    cpu = BlockAllocator(Device.CPU, BLOCK_SIZE, 2)
    block = gpu.allocate()
    with pytest.raises(ValueError):
        cpu.free(block)


def test_cached_blocks_past_the_cap_are_evicted_oldest_first_and_written_blocks_are_reused():
    evicted = []
    alloc = BlockAllocator(Device.GPU, BLOCK_SIZE, 10, on_evict=evicted.append, max_evictable=2)
    blocks = [alloc.allocate() for _ in range(4)]
    for number, block in enumerate(blocks):
        block.cache_key = ("cross", number)
        alloc.free(block)
    assert [b.block_number for b in evicted] == [0, 1]                 # the two least recently freed
    assert all(b.cache_key is None for b in evicted) and list(alloc.evictable) == [2, 3]
    assert alloc.get_num_free_blocks() == 10
    assert [alloc.allocate().block_number for _ in range(2)] == [1, 0]  # written blocks before untouched ones
    assert alloc.allocate().block_number == 4
    alloc.reuse(blocks[3])                                              # the cache takes one back
    assert list(alloc.evictable) == [2] and blocks[3].ref_count == 1


def test_without_a_cap_cached_blocks_wait_until_the_pool_needs_them():
    alloc = BlockAllocator(Device.GPU, BLOCK_SIZE, 3)
    blocks = [alloc.allocate() for _ in range(3)]
    for block in blocks:
        block.cache_key = ("prefix", block.block_number)
        alloc.free(block)
    assert list(alloc.evictable) == [0, 1, 2] and not alloc.free_blocks
    assert alloc.allocate().block_number == 0
    with pytest.raises(ValueError, match="max_evictable"):
        BlockAllocator(Device.GPU, BLOCK_SIZE, 3, max_evictable=-1)
