"""Stateful property test of the block manager: random admission, decoding, forking, swapping,
finishing and aborting of encoder/decoder and decoder-only requests, checked after every step
against an independent model of which logical blocks each table shares."""
from __future__ import annotations

import copy
import itertools
import math
from collections import Counter
from typing import Dict, List

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from seq2seq_engine.core.block import Device
from seq2seq_engine.core.block_manager import AllocStatus, BlockSpaceManager
from seq2seq_engine.inputs.data import SingletonInputs
from seq2seq_engine.sequence import Sequence, SequenceGroup, SequenceStatus

BLOCK_SIZE = 4
GPU, CPU = "GPU", "CPU"


def _admission(num_total: int, num_free: int, watermark_blocks: int, required: int) -> AllocStatus:
    # The documented meaning: NEVER if it cannot fit an empty pool (leaving the watermark),
    # OK if it fits now (leaving the watermark), LATER otherwise.
    if num_total - required < watermark_blocks:
        return AllocStatus.NEVER
    if num_free - required >= watermark_blocks:
        return AllocStatus.OK
    return AllocStatus.LATER


class BlockManagerMachine(RuleBasedStateMachine):
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

    # ------------------------------------------------------------------ rules
    @initialize(num_gpu=st.integers(6, 24), num_cpu=st.integers(0, 24),
                watermark=st.sampled_from([0.0, 0.0, 0.1, 0.25]))
    def setup(self, num_gpu, num_cpu, watermark):
        self._make_manager(num_gpu, num_cpu, watermark)

    @rule(dec_len=st.integers(1, 20), enc_len=st.one_of(st.just(0), st.integers(1, 30)),
          num_seqs=st.integers(1, 3))
    def add_request(self, dec_len, enc_len, num_seqs):
        rid = f"req-{next(self._ids)}"
        seqs = [Sequence(next(self._ids), SingletonInputs(prompt_token_ids=[5] * dec_len), BLOCK_SIZE)
                for _ in range(num_seqs)]
        encoder = (Sequence(next(self._ids), SingletonInputs(prompt_token_ids=[9] * enc_len), BLOCK_SIZE)
                   if enc_len else None)
        group = SequenceGroup(rid, seqs, arrival_time=0.0, encoder_seq=encoder)
        self_blocks = math.ceil(dec_len / BLOCK_SIZE)
        cross_blocks = math.ceil(enc_len / BLOCK_SIZE)
        expected = _admission(self.num_gpu, self._model_free_gpu(), self.watermark_blocks,
                              self_blocks + cross_blocks)
        status = self.bm.can_allocate(group)
        assert status == expected, (status, expected, dec_len, enc_len)
        if status != AllocStatus.OK:
            return
        free_before = self.bm.get_num_free_gpu_blocks()
        self.bm.allocate(group)
        assert self.bm.get_num_free_gpu_blocks() == free_before - self_blocks - cross_blocks
        prompt = self._new_logical(self_blocks)
        for seq in seqs:
            seq.status = SequenceStatus.RUNNING
            self.model_self[seq.seq_id] = list(prompt)
            self.seq_group[seq.seq_id] = rid
        if encoder is not None:
            self.model_cross[rid] = self._new_logical(cross_blocks)
            assert len(self.bm.get_cross_block_table(group)) == cross_blocks
        else:
            assert self.bm.get_cross_block_table(group) is None
        self.groups[rid] = group
        self.location[rid] = GPU

    @precondition(lambda self: self._running_seqs())
    @rule(data=st.data(), num_tokens=st.integers(1, 6))
    def append_tokens(self, data, num_tokens):
        seq_id = data.draw(st.sampled_from(self._running_seqs()), label="seq")
        for _ in range(num_tokens):
            if not self._append_one(seq_id):
                break

    def _append_one(self, seq_id: int) -> bool:
        rid = self.seq_group[seq_id]
        group = self.groups[rid]
        seq = group.find(seq_id)
        num_running = group.num_seqs(SequenceStatus.RUNNING)
        can = self.bm.can_append_slots(group)
        assert can == (self._model_free_gpu() >= num_running)
        if not can:
            return False  # the scheduler would preempt instead
        table_before = list(self.bm.block_tables[seq_id])
        model = self.model_self[seq_id]
        seq.append_token_id(3, {3: -0.5})
        cow = False
        if seq.get_len() > len(model) * BLOCK_SIZE:
            model.append(next(self._logical))
        elif self._logical_refcount()[model[-1]] > 1:
            cow = True
            model[-1] = next(self._logical)
        pairs = self.bm.append_slots(seq)
        table_after = self.bm.block_tables[seq_id]
        if cow:
            assert len(pairs) == 1, pairs
            assert pairs[0] == (table_before[-1].block_number, table_after[-1].block_number)
            assert table_after[-1] is not table_before[-1]
            assert table_after[:-1] == table_before[:-1]
        else:
            assert pairs == []
            assert table_after[:len(table_before)] == table_before
        return True

    @precondition(lambda self: self._running_seqs())
    @rule(data=st.data())
    def fork(self, data):
        seq_id = data.draw(st.sampled_from(self._running_seqs()), label="parent")
        rid = self.seq_group[seq_id]
        group = self.groups[rid]
        parent = group.find(seq_id)
        child = parent.fork(next(self._ids))
        assert child.status == SequenceStatus.RUNNING
        group.add(child)
        free_before = self.bm.get_num_free_gpu_blocks()
        self.bm.fork(parent, child)
        assert self.bm.get_num_free_gpu_blocks() == free_before
        self.model_self[child.seq_id] = list(self.model_self[seq_id])
        self.seq_group[child.seq_id] = rid

    @precondition(lambda self: self._running_seqs())
    @rule(data=st.data())
    def beam_step(self, data):
        """As the engine after a beam-search step: each running beam of a request is kept, forked for extra
        children, or freed when it has none; no block is allocated or copied here."""
        rid = data.draw(st.sampled_from(sorted({self.seq_group[s] for s in self._running_seqs()})), label="group")
        group = self.groups[rid]
        beams = group.get_seqs(SequenceStatus.RUNNING)
        parents = data.draw(st.lists(st.integers(0, len(beams) - 1), min_size=1, max_size=4), label="parents")
        free_before = self.bm.get_num_free_gpu_blocks()
        freed_logical = set()
        for index, beam in enumerate(beams):
            num_children = parents.count(index)
            if num_children == 0:
                freed_logical.update(self.model_self.pop(beam.seq_id))
                beam.status = SequenceStatus.FINISHED_STOPPED
                self.bm.free(beam)
                continue
            for _ in range(num_children - 1):
                child = beam.fork(next(self._ids))
                group.add(child)
                self.bm.fork(beam, child)
                self.model_self[child.seq_id] = list(self.model_self[beam.seq_id])
                self.seq_group[child.seq_id] = rid
        still_held = set(self._logical_refcount())
        assert self.bm.get_num_free_gpu_blocks() == free_before + len(freed_logical - still_held)

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

    @precondition(lambda self: self._groups_at(GPU))
    @rule(data=st.data())
    def swap_out(self, data):
        rid = data.draw(st.sampled_from(self._groups_at(GPU)), label="group")
        group = self.groups[rid]
        needed = len(self._group_logical(rid))
        can = self.bm.can_swap_out(group)
        assert can == (needed <= self._model_free_cpu()), (needed, self._model_free_cpu())
        if not can:
            return
        gpu_free, cpu_free = self.bm.get_num_free_gpu_blocks(), self.bm.get_num_free_cpu_blocks()
        before = self._group_tables(rid)
        mapping = self.bm.swap_out(group)
        for seq in group.get_seqs(SequenceStatus.RUNNING):
            seq.status = SequenceStatus.SWAPPED
        self.location[rid] = CPU
        self._check_swap_mapping(rid, before, self._group_tables(rid), mapping, Device.GPU, Device.CPU)
        assert self.bm.get_num_free_gpu_blocks() == gpu_free + needed
        assert self.bm.get_num_free_cpu_blocks() == cpu_free - needed

    @precondition(lambda self: self._groups_at(CPU))
    @rule(data=st.data())
    def swap_in(self, data):
        rid = data.draw(st.sampled_from(self._groups_at(CPU)), label="group")
        group = self.groups[rid]
        needed = len(self._group_logical(rid))
        expected = _admission(self.num_gpu, self._model_free_gpu(), self.watermark_blocks,
                              needed + group.num_seqs(SequenceStatus.SWAPPED))
        status = self.bm.can_swap_in(group)
        assert status == expected
        if status != AllocStatus.OK:
            return
        gpu_free, cpu_free = self.bm.get_num_free_gpu_blocks(), self.bm.get_num_free_cpu_blocks()
        before = self._group_tables(rid)
        mapping = self.bm.swap_in(group)
        for seq in group.get_seqs(SequenceStatus.SWAPPED):
            seq.status = SequenceStatus.RUNNING
        self.location[rid] = GPU
        self._check_swap_mapping(rid, before, self._group_tables(rid), mapping, Device.CPU, Device.GPU)
        assert self.bm.get_num_free_gpu_blocks() == gpu_free - needed
        assert self.bm.get_num_free_cpu_blocks() == cpu_free + needed

    @precondition(lambda self: self._running_seqs())
    @rule(data=st.data())
    def finish(self, data):
        seq_id = data.draw(st.sampled_from(self._running_seqs()), label="seq")
        rid = self.seq_group[seq_id]
        group = self.groups[rid]
        seq = group.find(seq_id)
        seq.status = SequenceStatus.FINISHED_STOPPED
        self.bm.free(seq)
        del self.model_self[seq_id]
        assert seq_id not in self.bm.block_tables
        if group.num_unfinished_seqs() == 0:
            self.bm.free_cross(group)
            self._drop_group_from_model(rid)

    @precondition(lambda self: self.groups)
    @rule(data=st.data())
    def abort(self, data):
        rid = data.draw(st.sampled_from(sorted(self.groups)), label="group")
        group = self.groups[rid]
        for seq in group.get_unfinished_seqs():
            seq.status = SequenceStatus.FINISHED_ABORTED
            self.bm.free(seq)
        self.bm.free_cross(group)
        self._drop_group_from_model(rid)
        assert rid not in self.bm.cross_block_tables

    @precondition(lambda self: len(self.groups) >= 3)
    @rule()
    def reset(self):
        self.bm.reset()
        for group in self.groups.values():
            for seq in group.get_unfinished_seqs():
                seq.status = SequenceStatus.FINISHED_ABORTED
        for rid in list(self.groups):
            self._drop_group_from_model(rid)
        assert self.bm.get_num_free_gpu_blocks() == self.num_gpu
        assert self.bm.get_num_free_cpu_blocks() == self.num_cpu

    # ------------------------------------------------------------------ invariants
    @invariant()
    def tables_match_model(self):
        bm = self.bm
        live_seqs = {seq.seq_id for g in self.groups.values() for seq in g.get_unfinished_seqs()}
        assert set(bm.block_tables) == live_seqs == set(self.model_self)
        enc_dec = {rid for rid, g in self.groups.items() if g.encoder_seq is not None}
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
            if group.encoder_seq is not None:
                assert len(bm.cross_block_tables[rid]) == group.encoder_seq.n_blocks
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
        # reset() on a copy of the final state must restore both pools ...
        clone = copy.deepcopy(self.bm)
        clone.reset()
        assert clone.get_num_free_gpu_blocks() == self.num_gpu
        assert clone.get_num_free_cpu_blocks() == self.num_cpu
        assert clone.block_tables == {} and clone.cross_block_tables == {}
        assert all(b.ref_count == 0 for b in clone.gpu_allocator.free_blocks + clone.cpu_allocator.free_blocks)
        # ... and so must aborting every request one by one on the original.
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


BlockManagerMachine.TestCase.settings = settings(max_examples=100, stateful_step_count=40, deadline=None)
TestBlockManagerStateful = BlockManagerMachine.TestCase
