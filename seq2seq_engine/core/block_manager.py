"""Paged KV-cache accounting: self blocks per decoder sequence, cross blocks per request, device and CPU pools."""
from __future__ import annotations

import enum
from typing import Dict, List, Optional, Tuple

from seq2seq_engine.core.block import BlockAllocator, BlockTable, Device, PhysicalTokenBlock
from seq2seq_engine.sequence import Sequence, SequenceGroup, SequenceStatus


class AllocStatus(enum.Enum):
    """OK: fits now. LATER: fits once other requests free blocks. NEVER: larger than the whole pool."""

    OK = enum.auto()
    LATER = enum.auto()
    NEVER = enum.auto()


class BlockSpaceManager:
    """Maps sequences to physical blocks. Invariant: a block's ref_count equals the number of tables holding it."""

    def __init__(self, block_size: int, num_gpu_blocks: int, num_cpu_blocks: int, watermark: float = 0.01) -> None:
        self.block_size = block_size
        self.num_total_gpu_blocks = num_gpu_blocks
        self.num_total_cpu_blocks = num_cpu_blocks
        # Headroom kept free at admission so running sequences can still append without immediate preemption.
        self.watermark_blocks = int(watermark * num_gpu_blocks)
        self.gpu_allocator = BlockAllocator(Device.GPU, block_size, num_gpu_blocks)
        self.cpu_allocator = BlockAllocator(Device.CPU, block_size, num_cpu_blocks)
        self.block_tables: Dict[int, BlockTable] = {}
        self.cross_block_tables: Dict[str, BlockTable] = {}
        # Block numbers of each cross table, read every step; rebuilt when the request's table is replaced (swap).
        self._cross_numbers: Dict[str, Tuple[BlockTable, List[int]]] = {}

    # ----------------------------------------------------------------- allocation
    def _admission_status(self, num_required_blocks: int) -> AllocStatus:
        num_free = self.gpu_allocator.get_num_free_blocks()
        if self.num_total_gpu_blocks - num_required_blocks < self.watermark_blocks:
            return AllocStatus.NEVER
        if num_free - num_required_blocks >= self.watermark_blocks:
            return AllocStatus.OK
        return AllocStatus.LATER

    @staticmethod
    def _num_required_blocks(seq_group: SequenceGroup) -> int:
        # Waiting decoder sequences share one prompt table, so it is counted once.
        self_blocks = seq_group.get_seqs(SequenceStatus.WAITING)[0].n_blocks
        return self_blocks + seq_group.num_cross_blocks

    def can_allocate(self, seq_group: SequenceGroup) -> AllocStatus:
        return self._admission_status(self._num_required_blocks(seq_group))

    def _allocate_table(self, num_blocks: int, ref_count: int) -> BlockTable:
        table = [self.gpu_allocator.allocate() for _ in range(num_blocks)]
        for block in table:
            block.ref_count = ref_count
        return table

    def allocate(self, seq_group: SequenceGroup) -> None:
        """Give the waiting decoder sequences one shared prompt table and the request its cross table."""
        waiting = seq_group.get_seqs(SequenceStatus.WAITING)
        for seq in waiting:
            if seq.seq_id in self.block_tables:
                raise ValueError(f"sequence {seq.seq_id} already has a block table")
        if seq_group.encoder_len > 0 and seq_group.request_id in self.cross_block_tables:
            raise ValueError(f"request {seq_group.request_id} already has a cross block table")
        prompt_table = self._allocate_table(waiting[0].n_blocks, ref_count=len(waiting))
        for seq in waiting:
            self.block_tables[seq.seq_id] = list(prompt_table)
        if seq_group.encoder_len > 0:
            self.cross_block_tables[seq_group.request_id] = self._allocate_table(seq_group.num_cross_blocks,
                                                                                 ref_count=1)

    def can_append_slots(self, seq_group: SequenceGroup) -> bool:
        """Whether the free blocks cover what `append_slots` takes for each running sequence this step: a new block
        where its tokens (the one sampled last step included) outgrow its table, a copy where its last block
        is shared. A sequence whose tokens fit its own last block takes none, so a pool that is exactly full still
        finishes its requests."""
        needed = sum(self._blocks_to_append(seq) for seq in seq_group.get_seqs(SequenceStatus.RUNNING))
        return self.gpu_allocator.get_num_free_blocks() >= needed

    def _blocks_to_append(self, seq: Sequence) -> int:
        table = self.block_tables[seq.seq_id]
        missing = seq.n_blocks - len(table)
        if missing > 0:
            return missing
        return 1 if table and table[-1].ref_count > 1 else 0

    def append_slots(self, seq: Sequence) -> List[Tuple[int, int]]:
        """Make room for the sequence's new tokens; returns (src, dst) block pairs to copy (copy-on-write)."""
        table = self.block_tables[seq.seq_id]
        while len(table) < seq.n_blocks:
            table.append(self.gpu_allocator.allocate())
        last_block = table[-1]
        if last_block.ref_count == 1:
            return []
        # The last block is shared with a forked sequence and is about to be written: copy it.
        new_block = self.gpu_allocator.allocate()
        table[-1] = new_block
        self.gpu_allocator.free(last_block)
        return [(last_block.block_number, new_block.block_number)]

    def fork(self, parent_seq: Sequence, child_seq: Sequence) -> None:
        """The child shares all of the parent's blocks until one of them writes a shared block."""
        if child_seq.seq_id in self.block_tables:
            raise ValueError(f"sequence {child_seq.seq_id} already has a block table")
        parent_table = self.block_tables[parent_seq.seq_id]
        self.block_tables[child_seq.seq_id] = list(parent_table)
        for block in parent_table:
            block.ref_count += 1

    # ----------------------------------------------------------------- swapping
    def _get_physical_blocks(self, seq_group: SequenceGroup) -> List[PhysicalTokenBlock]:
        """Distinct blocks held by the group's unfinished sequences and its cross table."""
        blocks: Dict[int, PhysicalTokenBlock] = {}
        for seq in seq_group.get_unfinished_seqs():
            for block in self.block_tables.get(seq.seq_id, []):
                blocks[id(block)] = block
        for block in self.cross_block_tables.get(seq_group.request_id, []):
            blocks[id(block)] = block
        return list(blocks.values())

    def can_swap_in(self, seq_group: SequenceGroup) -> AllocStatus:
        # One extra block per sequence so that each can append after being swapped in.
        num_required = (len(self._get_physical_blocks(seq_group))
                        + seq_group.num_seqs(SequenceStatus.SWAPPED))
        return self._admission_status(num_required)

    def can_swap_out(self, seq_group: SequenceGroup) -> bool:
        return len(self._get_physical_blocks(seq_group)) <= self.cpu_allocator.get_num_free_blocks()

    def swap_in(self, seq_group: SequenceGroup) -> List[Tuple[int, int]]:
        """Move the group's swapped self tables and its cross table to the device; returns (cpu, gpu) pairs."""
        return self._swap(seq_group, SequenceStatus.SWAPPED, self.cpu_allocator, self.gpu_allocator)

    def swap_out(self, seq_group: SequenceGroup) -> List[Tuple[int, int]]:
        """Move the group's running self tables and its cross table to CPU; returns (gpu, cpu) pairs."""
        return self._swap(seq_group, SequenceStatus.RUNNING, self.gpu_allocator, self.cpu_allocator)

    def _swap(self, seq_group: SequenceGroup, status: SequenceStatus, src_allocator: BlockAllocator,
              dst_allocator: BlockAllocator) -> List[Tuple[int, int]]:
        mapping: Dict[int, Tuple[PhysicalTokenBlock, PhysicalTokenBlock]] = {}
        for seq in seq_group.get_seqs(status):
            self.block_tables[seq.seq_id] = self._swap_table(
                self.block_tables[seq.seq_id], src_allocator, dst_allocator, mapping)
        cross_table = self.cross_block_tables.get(seq_group.request_id)
        if cross_table is not None:
            self.cross_block_tables[seq_group.request_id] = self._swap_table(
                cross_table, src_allocator, dst_allocator, mapping)
        return [(src.block_number, dst.block_number) for src, dst in mapping.values()]

    @staticmethod
    def _swap_table(table: BlockTable, src_allocator: BlockAllocator, dst_allocator: BlockAllocator,
                    mapping: Dict[int, Tuple[PhysicalTokenBlock, PhysicalTokenBlock]]) -> BlockTable:
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

    # ----------------------------------------------------------------- freeing
    def _free_table(self, table: BlockTable) -> None:
        for block in table:
            allocator = self.gpu_allocator if block.device == Device.GPU else self.cpu_allocator
            allocator.free(block)

    def free(self, seq: Sequence) -> None:
        """Return a decoder sequence's self blocks; a no-op for a sequence that holds none."""
        table = self.block_tables.pop(seq.seq_id, None)
        if table is not None:
            self._free_table(table)

    def free_cross(self, seq_group: SequenceGroup) -> None:
        """Return a request's cross blocks; a no-op for a request that holds none."""
        table = self.cross_block_tables.pop(seq_group.request_id, None)
        self._cross_numbers.pop(seq_group.request_id, None)
        if table is not None:
            self._free_table(table)

    # ----------------------------------------------------------------- queries
    def get_block_table(self, seq: Sequence) -> List[int]:
        return [block.block_number for block in self.block_tables[seq.seq_id]]

    def get_cross_block_table(self, seq_group: SequenceGroup) -> Optional[List[int]]:
        """The request's cross block numbers (one list shared by every step while its table stands: read only)."""
        table = self.cross_block_tables.get(seq_group.request_id)
        if table is None:
            return None
        cached = self._cross_numbers.get(seq_group.request_id)
        if cached is None or cached[0] is not table:
            cached = (table, [block.block_number for block in table])
            self._cross_numbers[seq_group.request_id] = cached
        return cached[1]

    def get_num_free_gpu_blocks(self) -> int:
        return self.gpu_allocator.get_num_free_blocks()

    def get_num_free_cpu_blocks(self) -> int:
        return self.cpu_allocator.get_num_free_blocks()
