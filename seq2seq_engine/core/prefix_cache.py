"""Automatic prefix caching: full decoder blocks registered under their chained content hash once a step has
computed them, taken again by later sequences with the same prefix; freed ones wait as evictable blocks."""
from __future__ import annotations

from typing import Dict, List, Sequence

from seq2seq_engine.core.block import BlockAllocator, PhysicalTokenBlock

SELF_KIND = "self"


class PrefixCache:
    """Hash -> device block of cached full decoder blocks, and the counts of prompt tokens looked up and found
    (vLLM's prefix_cache_queries / prefix_cache_hits)."""

    def __init__(self, allocator: BlockAllocator) -> None:
        self.allocator = allocator
        self.blocks: Dict[bytes, PhysicalTokenBlock] = {}
        self.num_queried_tokens = 0
        self.num_hit_tokens = 0

    def longest_match(self, hashes: Sequence[bytes]) -> List[PhysicalTokenBlock]:
        """The cached blocks of the longest run of `hashes` from the first one (no references taken)."""
        matched = []
        for block_hash in hashes:
            block = self.blocks.get(block_hash)
            if block is None:
                break
            matched.append(block)
        return matched

    def take(self, blocks: Sequence[PhysicalTokenBlock], num_refs: int) -> None:
        """`num_refs` references to each matched block (evictable ones come back into use)."""
        for block in blocks:
            self.allocator.reuse(block)
            block.ref_count += num_refs - 1

    def count_lookup(self, num_queried_tokens: int, num_hit_tokens: int) -> None:
        self.num_queried_tokens += num_queried_tokens
        self.num_hit_tokens += num_hit_tokens

    def register(self, block_hash: bytes, block: PhysicalTokenBlock) -> None:
        """Register a block a finished step computed; a hash already held by another block keeps that block."""
        if block.cache_key is not None or block_hash in self.blocks:
            return
        block.cache_key = (SELF_KIND, block_hash)
        self.blocks[block_hash] = block

    def forget(self, block: PhysicalTokenBlock) -> None:
        """The allocator evicts `block`: its hash no longer finds it."""
        block_hash = block.cache_key[1]
        if self.blocks.get(block_hash) is block:
            del self.blocks[block_hash]
