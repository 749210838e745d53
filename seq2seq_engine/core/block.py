"""Physical KV-cache blocks and the allocator that hands them out from one pool (device or CPU), keeping freed
blocks that hold cached content until the pool needs them (least recently used first)."""
from __future__ import annotations

import enum
from collections import OrderedDict
from typing import Callable, Dict, Hashable, List, Optional, Tuple


class Device(enum.Enum):
    """Which pool a block lives in: the model's device (which may itself be the CPU) or the CPU swap space."""

    GPU = enum.auto()
    CPU = enum.auto()


class AllocStatus(enum.Enum):
    """OK: fits now. LATER: fits once other requests free blocks. NEVER: larger than the whole pool."""

    OK = enum.auto()
    LATER = enum.auto()
    NEVER = enum.auto()


class PhysicalTokenBlock:
    """One block of `block_size` K/V slots; `ref_count` is the number of block tables that hold it; `cache_key` is
    set while the block's content is registered in a cache (prefix_cache.py, cross_cache.py), None otherwise."""

    def __init__(self, device: Device, block_number: int, block_size: int) -> None:
        self.device = device
        self.block_number = block_number
        self.block_size = block_size
        self.ref_count = 0
        self.cache_key: Optional[Hashable] = None

    def __repr__(self) -> str:
        return f"PhysicalTokenBlock({self.device.name}, #{self.block_number}, ref_count={self.ref_count})"


BlockTable = List[PhysicalTokenBlock]


class BlockAllocator:
    """A fixed pool of blocks with reference counts. A block whose count reaches 0 returns to the free list, or, when
    it holds cached content (`cache_key` set), waits among the evictable blocks: it can still be taken back by the
    cache (`reuse`), and is handed out again only when no plain free block is left, the least recently freed first.
    At most `max_evictable` blocks wait (None: any number): past that the oldest is evicted into the free list at
    once, so a CPU pool, whose pages cost memory only once written, reuses written blocks instead of writing new ones
    (decisions §29). `on_evict(block)` tells the cache that owns the key before the block is reused for other
    content."""

    def __init__(self, device: Device, block_size: int, num_blocks: int,
                 on_evict: Optional[Callable[[PhysicalTokenBlock], None]] = None,
                 max_evictable: Optional[int] = None) -> None:
        if num_blocks < 0:
            raise ValueError(f"num_blocks must be >= 0, got {num_blocks}")
        if max_evictable is not None and max_evictable < 0:
            raise ValueError(f"max_evictable must be None or >= 0, got {max_evictable}")
        self.device = device
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.on_evict = on_evict
        self.max_evictable = max_evictable
        # Popped from the end: the lowest block numbers are handed out first.
        self.free_blocks: List[PhysicalTokenBlock] = [
            PhysicalTokenBlock(device, number, block_size) for number in reversed(range(num_blocks))]
        self.evictable: "OrderedDict[int, PhysicalTokenBlock]" = OrderedDict()

    def allocate(self) -> PhysicalTokenBlock:
        if self.free_blocks:
            block = self.free_blocks.pop()
        elif self.evictable:
            block = self._evict_oldest()
        else:
            raise RuntimeError(f"out of memory: no free {self.device.name} blocks left (pool of {self.num_blocks})")
        block.ref_count = 1
        return block

    def free(self, block: PhysicalTokenBlock) -> None:
        if block.device != self.device:
            raise ValueError(f"{block} does not belong to the {self.device.name} pool")
        if block.ref_count <= 0:
            raise ValueError(f"double free of {block}")
        block.ref_count -= 1
        if block.ref_count == 0:
            if block.cache_key is None:
                self.free_blocks.append(block)
            else:
                self.evictable[block.block_number] = block
                if self.max_evictable is not None and len(self.evictable) > self.max_evictable:
                    self.free_blocks.append(self._evict_oldest())

    def reuse(self, block: PhysicalTokenBlock) -> None:
        """Take one more reference to a cached block, an evictable one included."""
        if block.ref_count == 0:
            del self.evictable[block.block_number]
        block.ref_count += 1

    def uncache(self, block: PhysicalTokenBlock) -> None:
        """Forget the block's cached content; an evictable one becomes a plain free block."""
        block.cache_key = None
        if block.ref_count == 0 and self.evictable.pop(block.block_number, None) is not None:
            self.free_blocks.append(block)

    def evict_all(self) -> int:
        """Forget the content of every evictable block (each owning cache told), so they become plain free blocks;
        returns how many were evictable."""
        count = 0
        while self.evictable:  # on_evict may uncache an entry's other blocks, which leaves the dict shorter
            self.free_blocks.append(self._evict_oldest())
            count += 1
        return count

    def _evict_oldest(self) -> PhysicalTokenBlock:
        """The least recently freed evictable block, its owning cache told and its content forgotten."""
        _, block = self.evictable.popitem(last=False)
        if self.on_evict is not None:
            self.on_evict(block)
        block.cache_key = None
        return block

    def get_num_free_blocks(self) -> int:
        """Blocks an allocation can take: the plain free ones and the evictable cached ones."""
        return len(self.free_blocks) + len(self.evictable)

    def get_num_evictable_blocks(self) -> int:
        return len(self.evictable)


def swap_table(table: BlockTable, src_allocator: BlockAllocator, dst_allocator: BlockAllocator,
               mapping: Dict[int, Tuple[PhysicalTokenBlock, PhysicalTokenBlock]]) -> BlockTable:
    """`table` moved to `dst_allocator`'s pool: a block already moved for another table of the request (`mapping`:
    id of source -> (source, destination)) is shared again, every source reference is returned."""
    new_table = []
    for src_block in table:
        if id(src_block) in mapping:
            dst_block = mapping[id(src_block)][1]
            dst_block.ref_count += 1
        else:
            dst_block = dst_allocator.allocate()
            mapping[id(src_block)] = (src_block, dst_block)
        new_table.append(dst_block)
        src_allocator.free(src_block)
    return new_table
