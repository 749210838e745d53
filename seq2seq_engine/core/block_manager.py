"""Paged KV-cache accounting: self blocks per decoder sequence, cross blocks per request (shared by requests with the
same encoder content), device and CPU pools, and the prefix cache of full decoder blocks."""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

from seq2seq_engine.core.block import AllocStatus, BlockAllocator, BlockTable, Device, PhysicalTokenBlock
from seq2seq_engine.core.block_swap import BlockSwapping
from seq2seq_engine.core.content_keys import adapter_key, extend_block_hashes, request_encoder_key, shares_prefix
from seq2seq_engine.core.cross_cache import CrossCache, CrossEntry
from seq2seq_engine.core.prefix_cache import SELF_KIND, PrefixCache
from seq2seq_engine.sequence import Sequence, SequenceGroup, SequenceStatus


class BlockSpaceManager(BlockSwapping):
    """Maps sequences to physical blocks. Invariant: a block's ref_count equals the number of tables holding it, a
    shared cross table (cross_cache.py) counting once for all its requests; cached blocks nobody holds are
    evictable (counted free). `enable_prefix_caching`: full decoder blocks are found again by content;
    `enable_encoder_cache`: requests with the same encoder input share one cross table."""

    def __init__(self, block_size: int, num_gpu_blocks: int, num_cpu_blocks: int, watermark: float = 0.01,
                 enable_prefix_caching: bool = False, enable_encoder_cache: bool = False,
                 max_cached_blocks: Optional[int] = None) -> None:
        self.block_size = block_size
        self.num_total_gpu_blocks = num_gpu_blocks
        self.num_total_cpu_blocks = num_cpu_blocks
        # Headroom kept free at admission so running sequences can still append without immediate preemption.
        self.watermark_blocks = int(watermark * num_gpu_blocks)
        self.gpu_allocator = BlockAllocator(Device.GPU, block_size, num_gpu_blocks, on_evict=self._on_evict,
                                            max_evictable=max_cached_blocks)
        self.cpu_allocator = BlockAllocator(Device.CPU, block_size, num_cpu_blocks)
        self.prefix_cache = PrefixCache(self.gpu_allocator) if enable_prefix_caching else None
        self.cross_cache = CrossCache(self.gpu_allocator) if enable_encoder_cache else None
        self.block_tables: Dict[int, BlockTable] = {}
        self.cross_block_tables: Dict[str, BlockTable] = {}
        self.cross_entries: Dict[str, CrossEntry] = {}   # requests whose cross table is a cached entry
        # Block numbers of each cross table, read every step; rebuilt when the request's table is replaced (swap).
        self._cross_numbers: Dict[str, Tuple[BlockTable, List[int]]] = {}
        # The same for each self table, also kept up to date by append_slots (which grows a table in place).
        self._self_numbers: Dict[int, Tuple[BlockTable, List[int]]] = {}

    # ----------------------------------------------------------------- allocation
    def _admission_status(self, num_required_blocks: int) -> AllocStatus:
        num_free = self.gpu_allocator.get_num_free_blocks()
        if self.num_total_gpu_blocks - num_required_blocks < self.watermark_blocks:
            return AllocStatus.NEVER
        if num_free - num_required_blocks >= self.watermark_blocks:
            return AllocStatus.OK
        return AllocStatus.LATER

    def _on_evict(self, block: PhysicalTokenBlock) -> None:
        if block.cache_key[0] == SELF_KIND:
            self.prefix_cache.forget(block)
        else:
            self.cross_cache.evict(block)

    # ----------------------------------------------------------------- content keys
    def _encoder_key(self, seq_group: SequenceGroup) -> Optional[bytes]:
        """The request's encoder content key, or None without an encoder or a cache to use it."""
        if seq_group.encoder_len == 0 or (self.cross_cache is None and self.prefix_cache is None):
            return None
        return request_encoder_key(seq_group)

    def _block_hashes(self, seq_group: SequenceGroup, seq: Sequence, num_blocks: int) -> List[bytes]:
        seed = self._encoder_key(seq_group) or adapter_key(seq_group.lora_cache_tag)
        return extend_block_hashes(seq.block_hashes, seq.get_token_ids(), self.block_size, num_blocks,
                                   seed)[:num_blocks]

    def _prefix_hits(self, seq_group: SequenceGroup) -> List[PhysicalTokenBlock]:
        """Cached blocks of the waiting prompt's longest cached prefix; the block of its last token is always
        computed again (its logits are sampled)."""
        if self.prefix_cache is None or not shares_prefix(seq_group.sampling_params):
            return []
        seq = seq_group.get_seqs(SequenceStatus.WAITING)[0]
        if seq.data.get_num_computed_tokens():
            return []
        num_blocks = (seq.get_len() - 1) // self.block_size
        return self.prefix_cache.longest_match(self._block_hashes(seq_group, seq, num_blocks))

    def num_cached_prefix_tokens(self, seq_group: SequenceGroup) -> int:
        """Prompt tokens of a waiting request that admission would find in the prefix cache."""
        return len(self._prefix_hits(seq_group)) * self.block_size

    def _cached_cross_entry(self, seq_group: SequenceGroup) -> Optional[CrossEntry]:
        """The cross entry of the request's encoder content, cached or being computed this step, if any."""
        key = self._encoder_key(seq_group) if self.cross_cache is not None else None
        return self.cross_cache.find(key) if key is not None else None

    def runs_encoder(self, seq_group: SequenceGroup) -> bool:
        """Whether admitting the request runs its encoder: no cross entry of its content is cached or being
        computed this step."""
        return seq_group.encoder_len > 0 and self._cached_cross_entry(seq_group) is None

    def _num_required_blocks(self, seq_group: SequenceGroup) -> int:
        # Waiting decoder sequences share one prompt table, so it is counted once; cached blocks in use by other
        # requests cost nothing, evictable ones leave the free count when taken.
        hits = self._prefix_hits(seq_group)
        self_blocks = seq_group.get_seqs(SequenceStatus.WAITING)[0].n_blocks - sum(b.ref_count > 0 for b in hits)
        entry = self._cached_cross_entry(seq_group)
        cross_blocks = 0 if entry is not None and entry.holders > 0 else seq_group.num_cross_blocks
        return self_blocks + cross_blocks

    def can_allocate(self, seq_group: SequenceGroup) -> AllocStatus:
        return self._admission_status(self._num_required_blocks(seq_group))

    def _allocate_table(self, num_blocks: int, ref_count: int) -> BlockTable:
        table = [self.gpu_allocator.allocate() for _ in range(num_blocks)]
        for block in table:
            block.ref_count = ref_count
        return table

    def allocate(self, seq_group: SequenceGroup) -> None:
        """Give the waiting decoder sequences one shared prompt table (its cached prefix first, those tokens
        counted computed) and the request its cross table (a cached entry of its encoder content where one is)."""
        waiting = seq_group.get_seqs(SequenceStatus.WAITING)
        for seq in waiting:
            if seq.seq_id in self.block_tables:
                raise ValueError(f"sequence {seq.seq_id} already has a block table")
        if seq_group.encoder_len > 0 and seq_group.request_id in self.cross_block_tables:
            raise ValueError(f"request {seq_group.request_id} already has a cross block table")
        hits = self._prefix_hits(seq_group)
        if self.prefix_cache is not None and shares_prefix(seq_group.sampling_params):
            self.prefix_cache.count_lookup(waiting[0].get_len(), len(hits) * self.block_size)
            self.prefix_cache.take(hits, len(waiting))
        # A cached cross table is taken before new blocks are allocated (which may evict idle cached blocks).
        cross_first = seq_group.encoder_len > 0 and not self.runs_encoder(seq_group)
        if cross_first:
            self._allocate_cross(seq_group)
        prompt_table = hits + self._allocate_table(waiting[0].n_blocks - len(hits), ref_count=len(waiting))
        if seq_group.encoder_len > 0 and not cross_first:
            self._allocate_cross(seq_group)
        for seq in waiting:
            self.block_tables[seq.seq_id] = list(prompt_table)
            if hits:
                seq.data.update_num_computed_tokens(len(hits) * self.block_size)

    def _allocate_cross(self, seq_group: SequenceGroup) -> None:
        request_id = seq_group.request_id
        if self.cross_cache is None:
            self.cross_block_tables[request_id] = self._allocate_table(seq_group.num_cross_blocks, ref_count=1)
            return
        entry = self.cross_cache.acquire(self._encoder_key(seq_group), seq_group.num_cross_blocks)
        self.cross_entries[request_id] = entry
        self.cross_block_tables[request_id] = entry.table

    def is_cross_computed(self, seq_group: SequenceGroup) -> bool:
        """Whether the request's cross table holds its encoder output already (a cache hit on a computed entry)."""
        entry = self.cross_entries.get(seq_group.request_id)
        return entry is not None and entry.computed

    def mark_computed(self, seq_group: SequenceGroup, num_computed_tokens: int) -> None:
        """A step computed the request's prefill up to `num_computed_tokens` decoder tokens: its cross entry is
        written, and its full prompt blocks join the prefix cache."""
        entry = self.cross_entries.get(seq_group.request_id)
        if entry is not None:
            entry.computed = True
        if self.prefix_cache is None or not shares_prefix(seq_group.sampling_params):
            return
        for seq in seq_group.get_unfinished_seqs()[:1]:  # the sequences of a prefill share its prompt table
            num_full = min(num_computed_tokens, seq.get_len()) // self.block_size
            table = self.block_tables[seq.seq_id]
            for block_hash, block in zip(self._block_hashes(seq_group, seq, num_full), table):
                self.prefix_cache.register(block_hash, block)

    def can_append_slots(self, seq_group: SequenceGroup) -> bool:
        """Whether the free blocks cover what `append_slots` takes for each running sequence this step: a new block
        where its tokens (the one sampled last step included) outgrow its table, a copy where its last block
        is shared. A sequence whose tokens fit its own last block takes none, so a pool that is exactly full still
        finishes its requests."""
        needed = sum(self._blocks_to_append(seq) for seq in seq_group.get_seqs(SequenceStatus.RUNNING))
        return self.gpu_allocator.get_num_free_blocks() >= needed

    def append_slot(self, seq: Sequence) -> Optional[List[Tuple[int, int]]]:
        """`append_slots` of a request whose only running sequence is `seq` when the free blocks cover it (the
        copies to make), else None, changing nothing."""
        table = self.block_tables[seq.seq_id]
        if seq.n_blocks <= len(table) and table and table[-1].ref_count == 1:
            return []   # room in its own last block: nothing to take
        if self.gpu_allocator.get_num_free_blocks() < self._blocks_to_append(seq):
            return None
        return self.append_slots(seq)

    def _blocks_to_append(self, seq: Sequence) -> int:
        table = self.block_tables[seq.seq_id]
        missing = seq.n_blocks - len(table)
        if missing > 0:
            return missing
        return 1 if table and table[-1].ref_count > 1 else 0

    def append_slots(self, seq: Sequence) -> List[Tuple[int, int]]:
        """Make room for the sequence's new tokens; returns (src, dst) block pairs to copy (copy-on-write)."""
        table = self.block_tables[seq.seq_id]
        cached = self._self_numbers.get(seq.seq_id)
        numbers = cached[1] if cached is not None and cached[0] is table else None
        num_blocks = seq.n_blocks
        while len(table) < num_blocks:
            table.append(self.gpu_allocator.allocate())
            if numbers is not None:
                numbers.append(table[-1].block_number)
        last_block = table[-1]
        if last_block.ref_count == 1:
            return []
        # The last block is shared with a forked sequence and is about to be written: copy it.
        new_block = self.gpu_allocator.allocate()
        table[-1] = new_block
        if numbers is not None:
            numbers[-1] = new_block.block_number
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

    # ----------------------------------------------------------------- freeing
    def _free_table(self, table: BlockTable) -> None:
        for block in table:
            allocator = self.gpu_allocator if block.device == Device.GPU else self.cpu_allocator
            allocator.free(block)

    def free(self, seq: Sequence) -> None:
        """Return a decoder sequence's self blocks; a no-op for a sequence that holds none."""
        table = self.block_tables.pop(seq.seq_id, None)
        self._self_numbers.pop(seq.seq_id, None)
        if table is not None:
            self._free_table(table)

    def free_cross(self, seq_group: SequenceGroup) -> None:
        """Return a request's cross blocks (its hold on a shared entry); a no-op for a request that holds none."""
        self._free_cross_table(seq_group.request_id)

    def _free_cross_table(self, request_id: str) -> None:
        table = self.cross_block_tables.pop(request_id, None)
        self._cross_numbers.pop(request_id, None)
        entry = self.cross_entries.pop(request_id, None)
        if entry is not None:
            self.cross_cache.release(entry)
        elif table is not None:
            self._free_table(table)

    def reset(self) -> None:
        """vLLM's name: free every table held (each sequence's self table, on the device or swapped out, and each
        request's cross table) and forget every cached block (reset_prefix_cache), leaving every device and CPU
        block free and handed out in the order of a new manager. The caches' lookup and hit counts go on counting
        (the server's metrics are counters)."""
        for seq_id in list(self.block_tables):
            self._free_table(self.block_tables.pop(seq_id))
        self._self_numbers.clear()
        for request_id in list(self.cross_block_tables):
            self._free_cross_table(request_id)
        self.reset_prefix_cache()
        for allocator in (self.gpu_allocator, self.cpu_allocator):
            # a new allocator pops its lowest block numbers first
            allocator.free_blocks.sort(key=lambda block: block.block_number, reverse=True)

    # ----------------------------------------------------------------- queries
    def get_block_table(self, seq: Sequence) -> List[int]:
        """The sequence's block numbers (one list kept up to date while its table stands: read only)."""
        table = self.block_tables[seq.seq_id]
        cached = self._self_numbers.get(seq.seq_id)
        if cached is None or cached[0] is not table:
            cached = (table, [block.block_number for block in table])
            self._self_numbers[seq.seq_id] = cached
        return cached[1]

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

    def reset_prefix_cache(self) -> bool:
        """Forget every cached block (prefix and encoder caches): each is evicted now, as the pool would on need."""
        self.gpu_allocator.evict_all()
        return True

    def get_num_free_gpu_blocks(self) -> int:
        return self.gpu_allocator.get_num_free_blocks()

    def get_num_free_cpu_blocks(self) -> int:
        return self.cpu_allocator.get_num_free_blocks()
