"""Cross-attention tables shared by encoder content: requests whose encoder input hashes to the same key hold one
table, written by one encoder run; a table nobody holds stays cached (its blocks evictable) until the pool needs
its blocks."""
from __future__ import annotations

import dataclasses
from typing import Dict, Optional

from seq2seq_engine.core.block import BlockAllocator, BlockTable, PhysicalTokenBlock

CROSS_KIND = "cross"


@dataclasses.dataclass(eq=False)
class CrossEntry:
    """One encoder output's cross table. Its blocks carry one reference while anyone holds the entry; `computed`
    turns true once a finished step has written them (a request taking an uncomputed entry in the step that
    computes it reads what that step writes)."""

    key: bytes
    table: BlockTable
    holders: int = 1
    computed: bool = False


class CrossCache:
    """Encoder key -> CrossEntry, with the counts of lookups and hits (one per admitted request)."""

    def __init__(self, allocator: BlockAllocator) -> None:
        self.allocator = allocator
        self.entries: Dict[bytes, CrossEntry] = {}
        self.num_queries = 0
        self.num_hits = 0

    def find(self, key: bytes) -> Optional[CrossEntry]:
        return self.entries.get(key)

    def acquire(self, key: bytes, num_blocks: int) -> CrossEntry:
        """The entry of `key`, held once more, or a new one with `num_blocks` fresh blocks (not computed)."""
        self.num_queries += 1
        entry = self.entries.get(key)
        if entry is not None:
            self.num_hits += 1
            if entry.holders == 0:
                for block in entry.table:
                    self.allocator.reuse(block)
            entry.holders += 1
            return entry
        table = [self.allocator.allocate() for _ in range(num_blocks)]
        for block in table:
            block.cache_key = (CROSS_KIND, key)
        entry = self.entries[key] = CrossEntry(key, table)
        return entry

    def release(self, entry: CrossEntry) -> None:
        """One holder fewer; with none left a computed table stays cached, an uncomputed one is freed."""
        if entry.holders <= 0:
            raise ValueError(f"cross entry {entry.key.hex()} released more often than it was held")
        entry.holders -= 1
        if entry.holders:
            return
        if not entry.computed:
            self.detach(entry)
        for block in entry.table:
            self.allocator.free(block)

    def detach(self, entry: CrossEntry) -> None:
        """Take the entry out of the cache: its table becomes a plain table of its (single) holder."""
        if self.entries.get(entry.key) is entry:
            del self.entries[entry.key]
        for block in entry.table:
            self.allocator.uncache(block)

    def evict(self, block: PhysicalTokenBlock) -> None:
        """The allocator reuses one of an idle entry's blocks: the whole entry leaves the cache."""
        entry = self.entries.pop(block.cache_key[1], None)
        if entry is None:
            return
        for other in entry.table:
            if other is not block:
                self.allocator.uncache(other)
