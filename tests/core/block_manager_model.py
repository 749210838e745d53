"""The independent model behind test_block_manager_properties: which logical blocks each sequence's table and each
request's cross table hold (shared logical ids = shared blocks), where each request lives (GPU / CPU), and the
invariants and teardown checks of the block manager against it. The rules that drive both live in the test."""
from __future__ import annotations

import itertools
from collections import Counter
from typing import Dict, List

from hypothesis.stateful import RuleBasedStateMachine, invariant

from seq2seq_engine.core.block import Device
from seq2seq_engine.core.block_manager import BlockSpaceManager
from seq2seq_engine.sequence import SequenceGroup, SequenceStatus

BLOCK_SIZE = 4
GPU, CPU = "GPU", "CPU"


class BlockManagerModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self._ids = itertools.count()
        self._logical = itertools.count()
        self._make_manager(16, 16, 0.0)

    def _make_manager(self, num_gpu: int, num_cpu: int, watermark: float) -> None:
        self.num_gpu, self.num_cpu = num_gpu, num_cpu
        self.watermark_blocks = int(watermark * num_gpu)
        self.bm = BlockSpaceManager(BLOCK_SIZE, num_gpu, num_cpu, watermark=watermark)
        # Model state, kept independently of the manager.
        self.groups: Dict[str, SequenceGroup] = {}
        self.location: Dict[str, str] = {}  # request_id -> GPU / CPU
        self.model_self: Dict[int, List[int]] = {}  # seq_id -> logical block ids
        self.model_cross: Dict[str, List[int]] = {}  # request_id -> logical block ids
        self.seq_group: Dict[int, str] = {}  # seq_id -> request_id

    # ------------------------------------------------------------------ model helpers
    def _new_logical(self, n: int) -> List[int]:
        return [next(self._logical) for _ in range(n)]

    def _group_logical(self, rid: str) -> set:
        group = self.groups[rid]
        ids = set()
        for seq in group.get_unfinished_seqs():
            ids.update(self.model_self[seq.seq_id])
        ids.update(self.model_cross.get(rid, []))
        return ids

    def _model_used(self, where: str) -> int:
        used = set()
        for rid, loc in self.location.items():
            if loc == where:
                used |= self._group_logical(rid)
        return len(used)

    def _model_free_gpu(self) -> int:
        return self.num_gpu - self._model_used(GPU)

    def _model_free_cpu(self) -> int:
        return self.num_cpu - self._model_used(CPU)

    def _logical_refcount(self) -> Counter:
        counts: Counter = Counter()
        for table in list(self.model_self.values()) + list(self.model_cross.values()):
            counts.update(table)
        return counts

    def _running_seqs(self) -> List[int]:
        return sorted(seq.seq_id for rid, g in self.groups.items() if self.location[rid] == GPU
                      for seq in g.get_seqs(SequenceStatus.RUNNING))

    def _groups_at(self, where: str) -> List[str]:
        return sorted(rid for rid, loc in self.location.items() if loc == where)

    def _group_tables(self, rid: str):
        group = self.groups[rid]
        selfs = {seq.seq_id: list(self.bm.block_tables[seq.seq_id]) for seq in group.get_unfinished_seqs()}
        cross = list(self.bm.cross_block_tables.get(rid, []))
        return selfs, cross

    def _drop_group_from_model(self, rid: str) -> None:
        group = self.groups.pop(rid)
        del self.location[rid]
        self.model_cross.pop(rid, None)
        for seq in group.get_seqs():
            self.model_self.pop(seq.seq_id, None)
            self.seq_group.pop(seq.seq_id, None)

    def _check_swap_mapping(self, rid, before, after, mapping, src_dev, dst_dev):
        self_before, cross_before = before
        self_after, cross_after = after
        distinct = {id(b): b for t in list(self_before.values()) + [cross_before] for b in t}
        assert len(mapping) == len(distinct) == len(self._group_logical(rid))
        srcs = [s for s, _ in mapping]
        dsts = [d for _, d in mapping]
        assert sorted(srcs) == sorted(b.block_number for b in distinct.values())
        assert len(set(srcs)) == len(srcs) and len(set(dsts)) == len(dsts)
        m = dict(mapping)
        for seq_id, table in self_before.items():
            assert [m[b.block_number] for b in table] == [b.block_number for b in self_after[seq_id]]
            assert all(b.device == src_dev for b in table)
            assert all(b.device == dst_dev for b in self_after[seq_id])
        assert [m[b.block_number] for b in cross_before] == [b.block_number for b in cross_after]
        assert all(b.device == dst_dev for b in cross_after)

    # ------------------------------------------------------------------ invariants
    @invariant()
    def tables_match_model(self):
        bm = self.bm
        live_seqs = {seq.seq_id for g in self.groups.values() for seq in g.get_unfinished_seqs()}
        assert set(bm.block_tables) == live_seqs == set(self.model_self)
        enc_dec = {rid for rid, g in self.groups.items() if g.encoder_len > 0}
        assert set(bm.cross_block_tables) == enc_dec == set(self.model_cross)

        logical_to_block: Dict[int, object] = {}
        block_to_logical: Dict[int, int] = {}

        def match(logical_table, table, where):
            assert len(logical_table) == len(table)
            for lid, block in zip(logical_table, table):
                assert block.device.name == where
                if lid in logical_to_block:
                    assert logical_to_block[lid] is block, "model-shared slot holds different blocks"
                else:
                    logical_to_block[lid] = block
                if id(block) in block_to_logical:
                    assert block_to_logical[id(block)] == lid, "one block holds two model blocks"
                else:
                    block_to_logical[id(block)] = lid

        for rid, group in self.groups.items():
            where = self.location[rid]
            for seq in group.get_unfinished_seqs():
                match(self.model_self[seq.seq_id], bm.block_tables[seq.seq_id], where)
                if seq.status == SequenceStatus.RUNNING:
                    assert where == GPU
                    assert len(bm.block_tables[seq.seq_id]) >= seq.n_blocks
                    assert len(bm.block_tables[seq.seq_id]) == seq.n_blocks
                else:
                    assert seq.status == SequenceStatus.SWAPPED and where == CPU
            if group.encoder_len > 0:
                assert len(bm.cross_block_tables[rid]) == group.num_cross_blocks
                match(self.model_cross[rid], bm.cross_block_tables[rid], where)

    @invariant()
    def refcounts_and_pools(self):
        bm = self.bm
        holders: Counter = Counter()
        blocks: Dict[int, object] = {}
        for table in list(bm.block_tables.values()) + list(bm.cross_block_tables.values()):
            for block in table:
                holders[id(block)] += 1
                blocks[id(block)] = block
        for key, block in blocks.items():
            assert block.ref_count == holders[key], block
        free_ids = {Device.GPU: {id(b) for b in bm.gpu_allocator.free_blocks},
                    Device.CPU: {id(b) for b in bm.cpu_allocator.free_blocks}}
        assert len(free_ids[Device.GPU]) == len(bm.gpu_allocator.free_blocks)
        assert len(free_ids[Device.CPU]) == len(bm.cpu_allocator.free_blocks)
        for key, block in blocks.items():
            assert key not in free_ids[Device.GPU] and key not in free_ids[Device.CPU], block
        for allocator in (bm.gpu_allocator, bm.cpu_allocator):
            for block in allocator.free_blocks:
                assert block.ref_count == 0 and block.device == allocator.device
        # (device, number) identifies exactly one block object, held or free.
        everything = list(blocks.values()) + bm.gpu_allocator.free_blocks + bm.cpu_allocator.free_blocks
        by_address: Dict[tuple, object] = {}
        for block in everything:
            address = (block.device, block.block_number)
            assert by_address.setdefault(address, block) is block, address
        held_gpu = sum(1 for b in blocks.values() if b.device == Device.GPU)
        held_cpu = sum(1 for b in blocks.values() if b.device == Device.CPU)
        assert all(0 <= b.block_number < self.num_gpu for b in everything if b.device == Device.GPU)
        assert all(0 <= b.block_number < self.num_cpu for b in everything if b.device == Device.CPU)
        assert bm.get_num_free_gpu_blocks() == self.num_gpu - held_gpu == self._model_free_gpu()
        assert bm.get_num_free_cpu_blocks() == self.num_cpu - held_cpu == self._model_free_cpu()

    def teardown(self):
        # Aborting every request one by one must restore both pools.
        for rid in sorted(self.groups):
            group = self.groups[rid]
            for seq in group.get_unfinished_seqs():
                seq.status = SequenceStatus.FINISHED_ABORTED
                self.bm.free(seq)
            self.bm.free_cross(group)
        assert self.bm.block_tables == {} and self.bm.cross_block_tables == {}
        assert self.bm.get_num_free_gpu_blocks() == self.num_gpu
        assert self.bm.get_num_free_cpu_blocks() == self.num_cpu
        all_free = self.bm.gpu_allocator.free_blocks + self.bm.cpu_allocator.free_blocks
        assert all(b.ref_count == 0 for b in all_free)
        assert len({(b.device, b.block_number) for b in all_free}) == self.num_gpu + self.num_cpu
