"""Swapping a request's KV blocks between the device pool and the CPU swap pool: its self tables and its cross
table, unless other requests share that cross table (then it stays on the device)."""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

from seq2seq_engine.core.block import AllocStatus, BlockAllocator, BlockTable, Device, PhysicalTokenBlock, swap_table
from seq2seq_engine.sequence import SequenceGroup, SequenceStatus


class BlockSwapping:
    """The swap half of BlockSpaceManager (block_manager.py), which owns the tables, allocators and caches read
    here."""

    def _moving_cross_table(self, seq_group: SequenceGroup, src: Device) -> Optional[BlockTable]:
        """The cross table that moves with the request out of `src`: none when it is elsewhere or shared with other
        requests (a shared table stays on the device while its other holders run)."""
        table = self.cross_block_tables.get(seq_group.request_id)
        if table is None or table[0].device != src:
            return None
        entry = self.cross_entries.get(seq_group.request_id)
        return None if entry is not None and entry.holders > 1 else table

    def _get_physical_blocks(self, seq_group: SequenceGroup, src: Device) -> List[PhysicalTokenBlock]:
        """Distinct blocks in `src` held by the group's unfinished sequences and its cross table that moves."""
        blocks: Dict[int, PhysicalTokenBlock] = {}
        for seq in seq_group.get_unfinished_seqs():
            for block in self.block_tables.get(seq.seq_id, []):
                blocks[id(block)] = block
        for block in self._moving_cross_table(seq_group, src) or []:
            blocks[id(block)] = block
        return list(blocks.values())

    def can_swap_in(self, seq_group: SequenceGroup) -> AllocStatus:
        # One extra block per sequence so that each can append after being swapped in.
        num_required = (len(self._get_physical_blocks(seq_group, Device.CPU))
                        + seq_group.num_seqs(SequenceStatus.SWAPPED))
        return self._admission_status(num_required)

    def can_swap_out(self, seq_group: SequenceGroup) -> bool:
        return len(self._get_physical_blocks(seq_group, Device.GPU)) <= self.cpu_allocator.get_num_free_blocks()

    def swap_in(self, seq_group: SequenceGroup) -> List[Tuple[int, int]]:
        """Move the group's swapped self tables and its cross table to the device; returns (cpu, gpu) pairs."""
        return self._swap(seq_group, SequenceStatus.SWAPPED, self.cpu_allocator, self.gpu_allocator)

    def swap_out(self, seq_group: SequenceGroup) -> List[Tuple[int, int]]:
        """Move the group's running self tables and its unshared cross table to CPU; returns (gpu, cpu) pairs."""
        return self._swap(seq_group, SequenceStatus.RUNNING, self.gpu_allocator, self.cpu_allocator)

    def _swap(self, seq_group: SequenceGroup, status: SequenceStatus, src_allocator: BlockAllocator,
              dst_allocator: BlockAllocator) -> List[Tuple[int, int]]:
        mapping: Dict[int, Tuple[PhysicalTokenBlock, PhysicalTokenBlock]] = {}
        for seq in seq_group.get_seqs(status):
            self.block_tables[seq.seq_id] = swap_table(
                self.block_tables[seq.seq_id], src_allocator, dst_allocator, mapping)
        cross_table = self._moving_cross_table(seq_group, src_allocator.device)
        if cross_table is not None:
            entry = self.cross_entries.pop(seq_group.request_id, None)
            if entry is not None:  # its only holder: the table leaves the cache and moves as a plain table
                self.cross_cache.detach(entry)
            self.cross_block_tables[seq_group.request_id] = swap_table(
                cross_table, src_allocator, dst_allocator, mapping)
        return [(src.block_number, dst.block_number) for src, dst in mapping.values()]
