"""Stateful property test of the block manager: random admission, decoding, forking, swapping,
finishing, aborting and resetting of encoder/decoder and decoder-only requests, checked after every step
against an independent model of which logical blocks each table shares (block_manager_model.py: the model, the
invariants and the teardown checks; here: the rules)."""
from __future__ import annotations

import math

from block_manager_model import BLOCK_SIZE, CPU, GPU, BlockManagerModel
from hypothesis import settings, strategies as st
from hypothesis.stateful import initialize, precondition, rule

from seq2seq_engine.core.block import Device
from seq2seq_engine.core.block_manager import AllocStatus, BlockSpaceManager
from seq2seq_engine.inputs.data import SingletonInputs
from seq2seq_engine.sequence import Sequence, SequenceGroup, SequenceStatus


def _admission(num_total: int, num_free: int, watermark_blocks: int, required: int) -> AllocStatus:
    # The documented meaning: NEVER if it cannot fit an empty pool (leaving the watermark),
    # OK if it fits now (leaving the watermark), LATER otherwise.
    if num_total - required < watermark_blocks:
        return AllocStatus.NEVER
    if num_free - required >= watermark_blocks:
        return AllocStatus.OK
    return AllocStatus.LATER


class BlockManagerMachine(BlockManagerModel):
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
        table_before = list(self.bm.block_tables[seq_id])
        model = self.model_self[seq_id]
        seq.append_token_id(3, {3: -0.5})  # as in a step: the sampled token is in the sequence before scheduling
        can = self.bm.can_append_slots(group)
        assert can == (self._model_free_gpu() >= self._model_blocks_to_append(group))
        if not can:
            seq.data.output_token_ids.pop()  # the scheduler would preempt instead
            return False
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

    def _model_blocks_to_append(self, group) -> int:
        """Blocks append_slots takes for the group's running sequences: one where a sequence outgrew its table,
        one where its last block is shared (copy-on-write)."""
        refcount = self._logical_refcount()
        needed = 0
        for seq in group.get_seqs(SequenceStatus.RUNNING):
            model = self.model_self[seq.seq_id]
            needed += 1 if seq.get_len() > len(model) * BLOCK_SIZE or refcount[model[-1]] > 1 else 0
        return needed

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

    @precondition(lambda self: self.groups)
    @rule()
    def reset(self):
        """Every table freed at once (the scheduler then drops its requests): the pools as a new manager's."""
        self.bm.reset()
        for rid in sorted(self.groups):
            for seq in self.groups[rid].get_unfinished_seqs():
                seq.status = SequenceStatus.FINISHED_ABORTED
            self._drop_group_from_model(rid)
        new = BlockSpaceManager(BLOCK_SIZE, self.num_gpu, self.num_cpu)
        for allocator, new_allocator in ((self.bm.gpu_allocator, new.gpu_allocator),
                                         (self.bm.cpu_allocator, new.cpu_allocator)):
            numbers = [block.block_number for block in allocator.free_blocks]
            assert numbers == [block.block_number for block in new_allocator.free_blocks]


BlockManagerMachine.TestCase.settings = settings(max_examples=100, stateful_step_count=40, deadline=None)
TestBlockManagerStateful = BlockManagerMachine.TestCase
