"""Physical KV-cache blocks and the allocator that hands them out from one pool (device or CPU)."""
from __future__ import annotations

import enum
from typing import List


class Device(enum.Enum):
    """Which pool a block lives in: the model's device (which may itself be the CPU) or the CPU swap space."""

    GPU = enum.auto()
    CPU = enum.auto()


class PhysicalTokenBlock:
    """One block of `block_size` K/V slots; `ref_count` is the number of block tables that hold it."""

    def __init__(self, device: Device, block_number: int, block_size: int) -> None:
        self.device = device
        self.block_number = block_number
        self.block_size = block_size
        self.ref_count = 0

    def __repr__(self) -> str:
        return f"PhysicalTokenBlock({self.device.name}, #{self.block_number}, ref_count={self.ref_count})"


BlockTable = List[PhysicalTokenBlock]


class BlockAllocator:
    """A fixed pool of blocks with reference counts; a block returns to the free list when its count reaches 0."""

    def __init__(self, device: Device, block_size: int, num_blocks: int) -> None:
        if num_blocks < 0:
            raise ValueError(f"num_blocks must be >= 0, got {num_blocks}")
        self.device = device
        self.block_size = block_size
        self.num_blocks = num_blocks
        # Popped from the end: the lowest block numbers are handed out first.
        self.free_blocks: List[PhysicalTokenBlock] = [
            PhysicalTokenBlock(device, number, block_size) for number in reversed(range(num_blocks))]

    def allocate(self) -> PhysicalTokenBlock:
        if not self.free_blocks:
            raise RuntimeError(f"out of memory: no free {self.device.name} blocks left (pool of {self.num_blocks})")
        block = self.free_blocks.pop()
        block.ref_count = 1
        return block

    def free(self, block: PhysicalTokenBlock) -> None:
        if block.device != self.device:
            raise ValueError(f"{block} does not belong to the {self.device.name} pool")
        if block.ref_count <= 0:
            raise ValueError(f"double free of {block}")
        block.ref_count -= 1
        if block.ref_count == 0:
            self.free_blocks.append(block)

    def get_num_free_blocks(self) -> int:
        return len(self.free_blocks)
