"""Stateful property test of the block manager with the prefix and encoder caches on: requests whose prompts and
encoder inputs repeat are admitted, prefilled (in steps that may hold several at once), decoded, swapped, finished,
aborted and all reset at once in a small pool. A model of what each physical block holds checks that a shared block
always holds the content its new holder needs, that reference counts equal the holders, that cached blocks nobody
holds are evictable and counted free, and that nothing leaks."""
from __future__ import annotations

import itertools
from collections import Counter
from typing import Dict, List

from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from seq2seq_engine.core.block import Device
from seq2seq_engine.core.block_manager import AllocStatus, BlockSpaceManager
from seq2seq_engine.core.content_keys import request_encoder_key
from seq2seq_engine.inputs.data import SingletonInputs
from seq2seq_engine.sequence import Sequence, SequenceGroup, SequenceStatus

BLOCK_SIZE = 4
PREFIXES = [[7] * 9, [7] * 4 + [8] * 5, [3, 1, 4, 1, 5, 9, 2, 6]]
DOCUMENTS = [[11] * 6, [12] * 9, [11] * 5 + [13]]


class CachingBlockManager(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self._ids = itertools.count()
        self.groups: Dict[str, SequenceGroup] = {}
        self.pending: List[str] = []          # admitted, prefill not yet run
        self.content: Dict[tuple, object] = {}  # (device, block number) -> what was written there

    @initialize(num_gpu=st.integers(10, 40), num_cpu=st.integers(0, 24))
    def setup(self, num_gpu, num_cpu):
        self.num_gpu, self.num_cpu = num_gpu, num_cpu
        self.bm = BlockSpaceManager(BLOCK_SIZE, num_gpu, num_cpu, watermark=0.0, enable_prefix_caching=True,
                                    enable_encoder_cache=True)

    # ------------------------------------------------------------------ helpers
    @staticmethod
    def _address(block):
        return (block.device, block.block_number)

    def _self_content(self, group, seq, index):
        """What block `index` of `seq` holds once written: the encoder input and every token up to its end."""
        encoder = tuple(group.encoder_seq.prompt_token_ids) if group.encoder_seq else ()
        return ("self", encoder, tuple(seq.get_token_ids()[:(index + 1) * BLOCK_SIZE]))

    def _cross_content(self, group):
        return ("cross", tuple(group.encoder_seq.prompt_token_ids))

    def _running(self):
        return sorted(rid for rid, g in self.groups.items() if rid not in self.pending
                      and g.get_seqs(SequenceStatus.RUNNING))

    def _swapped(self):
        return sorted(rid for rid, g in self.groups.items() if g.get_seqs(SequenceStatus.SWAPPED))

    # ------------------------------------------------------------------ rules
    @rule(prefix=st.integers(0, len(PREFIXES) - 1), suffix=st.integers(0, 6),
          document=st.one_of(st.none(), st.integers(0, len(DOCUMENTS) - 1)), num_seqs=st.integers(1, 2))
    def admit(self, prefix, suffix, document, num_seqs):
        rid = f"req-{next(self._ids)}"
        tokens = PREFIXES[prefix] + [20 + suffix] * suffix
        seqs = [Sequence(next(self._ids), SingletonInputs(prompt_token_ids=tokens), BLOCK_SIZE)
                for _ in range(num_seqs)]
        encoder = (Sequence(next(self._ids), SingletonInputs(prompt_token_ids=DOCUMENTS[document]), BLOCK_SIZE)
                   if document is not None else None)
        group = SequenceGroup(rid, seqs, arrival_time=0.0, encoder_seq=encoder)
        if self.bm.can_allocate(group) != AllocStatus.OK:
            return
        free_before = self.bm.get_num_free_gpu_blocks()
        self.bm.allocate(group)
        assert self.bm.get_num_free_gpu_blocks() >= free_before - (seqs[0].n_blocks + group.num_cross_blocks)
        computed = seqs[0].data.get_num_computed_tokens()
        assert computed % BLOCK_SIZE == 0 and computed < len(tokens)
        for index, block in enumerate(self.bm.block_tables[seqs[0].seq_id][:computed // BLOCK_SIZE]):
            assert self.content[self._address(block)] == self._self_content(group, seqs[0], index)
        if encoder is not None and self.bm.is_cross_computed(group):
            for block in self.bm.cross_block_tables[rid]:
                assert self.content[self._address(block)] == self._cross_content(group)
        for seq in seqs:
            seq.status = SequenceStatus.RUNNING
        self.groups[rid] = group
        self.pending.append(rid)

    @precondition(lambda self: self.pending)
    @rule()
    def run_prefills(self):
        """One step runs every pending prefill: encoders whose table is not computed (once per table), then the
        uncomputed prompt blocks; then the step is marked computed."""
        written_cross = set()
        for rid in self.pending:
            group = self.groups[rid]
            seq = group.first_seq
            if group.encoder_seq is not None and not self.bm.is_cross_computed(group):
                table = self.bm.cross_block_tables[rid]
                if id(table[0]) not in written_cross:
                    written_cross.add(id(table[0]))
                    for block in table:
                        self.content[self._address(block)] = self._cross_content(group)
            first_new = seq.data.get_num_computed_tokens() // BLOCK_SIZE
            table = self.bm.block_tables[seq.seq_id]
            for index in range(first_new, len(table)):
                self.content[self._address(table[index])] = self._self_content(group, seq, index)
        for rid in self.pending:
            group = self.groups[rid]
            self.bm.mark_computed(group, group.first_seq.get_len())
            for seq in group.get_seqs(SequenceStatus.RUNNING):
                seq.data.update_num_computed_tokens(seq.get_len() - seq.data.get_num_computed_tokens())
        self.pending = []

    @precondition(lambda self: self._running())
    @rule(data=st.data())
    def decode_one(self, data):
        rid = data.draw(st.sampled_from(self._running()), label="request")
        group = self.groups[rid]
        # each sequence may need a new block and a copy of a shared last block
        if self.bm.get_num_free_gpu_blocks() < 2 * group.num_seqs(SequenceStatus.RUNNING):
            return
        for seq in group.get_seqs(SequenceStatus.RUNNING):
            token = 30 + seq.get_len() % 5
            seq.append_token_id(token, {token: 0.0})
            for src, dst in self.bm.append_slots(seq):
                self.content[(Device.GPU, dst)] = self.content.get((Device.GPU, src))
            table = self.bm.block_tables[seq.seq_id]
            index = (seq.get_len() - 1) // BLOCK_SIZE
            self.content[self._address(table[index])] = self._self_content(group, seq, index)
            seq.data.update_num_computed_tokens(1)

    @precondition(lambda self: self._running())
    @rule(data=st.data())
    def fork(self, data):
        rid = data.draw(st.sampled_from(self._running()), label="request")
        group = self.groups[rid]
        parent = group.get_seqs(SequenceStatus.RUNNING)[0]
        child = parent.fork(next(self._ids))
        group.add(child)
        self.bm.fork(parent, child)

    @precondition(lambda self: self._running())
    @rule(data=st.data())
    def swap_out(self, data):
        rid = data.draw(st.sampled_from(self._running()), label="request")
        group = self.groups[rid]
        if not self.bm.can_swap_out(group):
            return
        for src, dst in self.bm.swap_out(group):
            self.content[(Device.CPU, dst)] = self.content.get((Device.GPU, src))
        for seq in group.get_seqs(SequenceStatus.RUNNING):
            seq.status = SequenceStatus.SWAPPED

    @precondition(lambda self: self._swapped())
    @rule(data=st.data())
    def swap_in(self, data):
        rid = data.draw(st.sampled_from(self._swapped()), label="request")
        group = self.groups[rid]
        if self.bm.can_swap_in(group) != AllocStatus.OK:
            return
        for src, dst in self.bm.swap_in(group):
            self.content[(Device.GPU, dst)] = self.content.get((Device.CPU, src))
        for seq in group.get_seqs(SequenceStatus.SWAPPED):
            seq.status = SequenceStatus.RUNNING

    @precondition(lambda self: self.groups)
    @rule(data=st.data())
    def finish(self, data):
        rid = data.draw(st.sampled_from(sorted(self.groups)), label="request")
        self._free(rid)

    @precondition(lambda self: self.groups)
    @rule()
    def reset(self):
        """Every table freed and every cached block forgotten at once (the scheduler then drops its requests)."""
        self.bm.reset()
        for group in self.groups.values():
            for seq in group.get_unfinished_seqs():
                seq.status = SequenceStatus.FINISHED_ABORTED
        self.groups, self.pending = {}, []
        assert not self.bm.prefix_cache.blocks and not self.bm.cross_cache.entries
        assert self.bm.gpu_allocator.get_num_evictable_blocks() == 0

    def _free(self, rid):
        group = self.groups.pop(rid)
        if rid in self.pending:
            self.pending.remove(rid)
        for seq in group.get_unfinished_seqs():
            seq.status = SequenceStatus.FINISHED_ABORTED
            self.bm.free(seq)
        self.bm.free_cross(group)

    # ------------------------------------------------------------------ invariants
    @invariant()
    def references_equal_holders(self):
        bm = self.bm
        holders: Counter = Counter()
        blocks = {}
        for table in bm.block_tables.values():
            for block in table:
                holders[id(block)] += 1
                blocks[id(block)] = block
        counted_tables = set()
        for table in bm.cross_block_tables.values():
            if id(table) in counted_tables:  # a shared entry's table holds its blocks once
                continue
            counted_tables.add(id(table))
            for block in table:
                holders[id(block)] += 1
                blocks[id(block)] = block
        for key, block in blocks.items():
            assert block.ref_count == holders[key], block
        for allocator in (bm.gpu_allocator, bm.cpu_allocator):
            idle = allocator.free_blocks + list(allocator.evictable.values())
            assert all(block.ref_count == 0 and id(block) not in blocks for block in idle)
            assert all(block.cache_key is None for block in allocator.free_blocks)
            assert all(block.cache_key is not None for block in allocator.evictable.values())
        held_gpu = sum(block.device == Device.GPU for block in blocks.values())
        assert bm.get_num_free_gpu_blocks() == self.num_gpu - held_gpu
        assert bm.get_num_free_cpu_blocks() == self.num_cpu - (len(blocks) - held_gpu)

    @invariant()
    def caches_point_at_their_content(self):
        bm = self.bm
        for block_hash, block in bm.prefix_cache.blocks.items():
            assert block.cache_key == ("self", block_hash) and block.device == Device.GPU
        for key, entry in bm.cross_cache.entries.items():
            assert all(block.cache_key == ("cross", key) for block in entry.table)
            if entry.computed:
                assert len({self.content.get(self._address(block)) for block in entry.table}) == 1
        for rid, entry in bm.cross_entries.items():
            group = self.groups[rid]
            assert entry.key == request_encoder_key(group) and bm.cross_block_tables[rid] is entry.table
        holders = Counter(id(entry) for entry in bm.cross_entries.values())
        for entry in {id(e): e for e in bm.cross_entries.values()}.values():
            assert entry.holders == holders[id(entry)]

    def teardown(self):
        if not hasattr(self, "bm"):
            return
        for rid in sorted(self.groups):
            self._free(rid)
        assert not self.bm.block_tables and not self.bm.cross_block_tables and not self.bm.cross_entries
        assert self.bm.get_num_free_gpu_blocks() == self.num_gpu
        assert self.bm.get_num_free_cpu_blocks() == self.num_cpu
        assert all(entry.holders == 0 and entry.computed for entry in self.bm.cross_cache.entries.values())


CachingBlockManager.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
TestCachingBlockManager = CachingBlockManager.TestCase
