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
