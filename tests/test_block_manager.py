"""Example-based tests of the paged KV-cache block manager (self tables per decoder sequence,
one cross table per encoder/decoder request, device and CPU pools)."""
from __future__ import annotations

import itertools
from typing import Optional

import pytest

from seq2seq_engine.core.block import BlockAllocator, Device
from seq2seq_engine.core.block_manager import AllocStatus, BlockSpaceManager
from seq2seq_engine.inputs.data import SingletonInputs
from seq2seq_engine.sequence import Sequence, SequenceGroup, SequenceStatus

BLOCK_SIZE = 4
NUM_GPU = 16
NUM_CPU = 16

_ids = itertools.count(1000)


def make_seq(length: int, seq_id: Optional[int] = None) -> Sequence:
    seq_id = next(_ids) if seq_id is None else seq_id
    return Sequence(seq_id, SingletonInputs(prompt_token_ids=list(range(1, length + 1))), BLOCK_SIZE)


def make_group(request_id: str, dec_len: int, enc_len: Optional[int] = None, num_seqs: int = 1) -> SequenceGroup:
    seqs = [make_seq(dec_len) for _ in range(num_seqs)]
    encoder = make_seq(enc_len) if enc_len is not None else None
    return SequenceGroup(request_id, seqs, arrival_time=0.0, encoder_seq=encoder)


def make_manager(num_gpu: int = NUM_GPU, num_cpu: int = NUM_CPU, watermark: float = 0.0) -> BlockSpaceManager:
    return BlockSpaceManager(BLOCK_SIZE, num_gpu, num_cpu, watermark=watermark)


def allocate_running(bm: BlockSpaceManager, group: SequenceGroup) -> None:
    bm.allocate(group)
    for seq in group.get_seqs(SequenceStatus.WAITING):
        seq.status = SequenceStatus.RUNNING


def grow(seq: Sequence, tok: int = 7) -> None:
    seq.append_token_id(tok, {tok: -0.5})


def blocks_of(bm: BlockSpaceManager, seq: Sequence):
    return bm.block_tables[seq.seq_id]


# --------------------------------------------------------------------- allocator


def test_allocator_hands_out_lowest_numbers_and_refcounts():
    alloc = BlockAllocator(Device.GPU, BLOCK_SIZE, 3)
    a, b = alloc.allocate(), alloc.allocate()
    assert (a.block_number, b.block_number) == (0, 1)
    assert a.ref_count == b.ref_count == 1
    assert alloc.get_num_free_blocks() == 1
    a.ref_count += 1
    alloc.free(a)
    assert alloc.get_num_free_blocks() == 1  # still referenced once
    alloc.free(a)
    assert alloc.get_num_free_blocks() == 2
    with pytest.raises(ValueError):
        alloc.free(a)  # double free
    alloc.allocate()
    alloc.allocate()
    with pytest.raises(RuntimeError):
        alloc.allocate()


def test_allocator_rejects_foreign_block():
    gpu = BlockAllocator(Device.GPU, BLOCK_SIZE, 2)
    cpu = BlockAllocator(Device.CPU, BLOCK_SIZE, 2)
    block = gpu.allocate()
    with pytest.raises(ValueError):
        cpu.free(block)


# --------------------------------------------------------------------- can_allocate / allocate


def test_can_allocate_ok_later_never():
    bm = make_manager()
    # 9 decoder tokens -> 3 blocks, 17 encoder tokens -> 5 blocks: 8 of 16.
    g1 = make_group("a", 9, 17)
    assert bm.can_allocate(g1) == AllocStatus.OK
    allocate_running(bm, g1)
    assert bm.get_num_free_gpu_blocks() == 8
    # Exactly the remaining 8 blocks still fits.
    assert bm.can_allocate(make_group("b", 16, 16)) == AllocStatus.OK
    # 9 blocks do not fit now, but would in an empty pool.
    assert bm.can_allocate(make_group("c", 17, 16)) == AllocStatus.LATER
    # 17 blocks never fit a 16-block pool; the cross part alone can make it too big.
    assert bm.can_allocate(make_group("d", 1, 64)) == AllocStatus.NEVER
    assert bm.can_allocate(make_group("e", 65)) == AllocStatus.NEVER
    # A 16-block request is fine in principle.
    assert bm.can_allocate(make_group("f", 32, 32)) == AllocStatus.LATER
    bm.free(g1.first_seq)
    bm.free_cross(g1)
    assert bm.can_allocate(make_group("f", 32, 32)) == AllocStatus.OK


def test_can_allocate_respects_watermark():
    bm = make_manager(watermark=0.25)  # 4 of 16 blocks kept free at admission
    assert bm.watermark_blocks == 4
    assert bm.can_allocate(make_group("a", 48)) == AllocStatus.OK  # 12 blocks, 4 left
    assert bm.can_allocate(make_group("b", 49)) == AllocStatus.NEVER  # 13 blocks, only 3 would be left
    assert bm.can_allocate(make_group("b", 24, 28)) == AllocStatus.NEVER  # 6 + 7 = 13
    allocate_running(bm, make_group("c", 8, 4))  # 3 blocks, 13 free
    assert bm.get_num_free_gpu_blocks() == 13
    assert bm.can_allocate(make_group("d", 36)) == AllocStatus.OK  # 9 blocks -> 4 left
    assert bm.can_allocate(make_group("e", 37)) == AllocStatus.LATER  # 10 blocks -> 3 left


def test_allocate_sizes_self_and_cross():
    bm = make_manager()
    g = make_group("r", 5, 13)  # ceil(5/4)=2, ceil(13/4)=4
    allocate_running(bm, g)
    table = bm.get_block_table(g.first_seq)
    cross = bm.get_cross_block_table(g)
    assert len(table) == 2
    assert len(cross) == 4
    assert len(set(table) | set(cross)) == 6  # all distinct
    assert all(0 <= b < NUM_GPU for b in table + cross)
    assert bm.get_num_free_gpu_blocks() == NUM_GPU - 6
    assert bm.get_num_free_cpu_blocks() == NUM_CPU
    for block in bm.block_tables[g.first_seq.seq_id] + bm.cross_block_tables["r"]:
        assert block.device == Device.GPU
        assert block.ref_count == 1


@pytest.mark.parametrize("dec_len,enc_len,self_blocks,cross_blocks", [
    (1, 1, 1, 1), (4, 4, 1, 1), (5, 8, 2, 2), (8, 9, 2, 3), (12, 30, 3, 8)])
def test_allocate_sizes_are_ceil(dec_len, enc_len, self_blocks, cross_blocks):
    bm = make_manager()
    g = make_group("r", dec_len, enc_len)
    allocate_running(bm, g)
    assert len(bm.get_block_table(g.first_seq)) == self_blocks
    assert len(bm.get_cross_block_table(g)) == cross_blocks
    assert bm.get_num_free_gpu_blocks() == NUM_GPU - self_blocks - cross_blocks


def test_decoder_only_group_has_no_cross_table():
    bm = make_manager()
    g = make_group("dec-only", 6)
    assert bm.can_allocate(g) == AllocStatus.OK
    allocate_running(bm, g)
    assert bm.get_cross_block_table(g) is None
    assert "dec-only" not in bm.cross_block_tables
    assert len(bm.get_block_table(g.first_seq)) == 2
    assert bm.get_num_free_gpu_blocks() == NUM_GPU - 2
    bm.free_cross(g)  # no-op
    assert bm.get_num_free_gpu_blocks() == NUM_GPU - 2


def test_waiting_seqs_share_prompt_table():
    bm = make_manager()
    g = make_group("multi", 6, 3, num_seqs=3)
    allocate_running(bm, g)
    seqs = g.get_seqs()
    tables = [bm.get_block_table(s) for s in seqs]
    assert tables[0] == tables[1] == tables[2]
    assert len(tables[0]) == 2
    # Prompt blocks counted once, each referenced by all three tables.
    assert bm.get_num_free_gpu_blocks() == NUM_GPU - 2 - 1
    for block in blocks_of(bm, seqs[0]):
        assert block.ref_count == 3
    # Tables are separate lists (growing one must not grow the others).
    assert blocks_of(bm, seqs[0]) is not blocks_of(bm, seqs[1])
    # Freeing two of them keeps the blocks alive; the third releases them.
    bm.free(seqs[0])
    bm.free(seqs[1])
    assert bm.get_num_free_gpu_blocks() == NUM_GPU - 3
    bm.free(seqs[2])
    assert bm.get_num_free_gpu_blocks() == NUM_GPU - 1
    bm.free_cross(g)
    assert bm.get_num_free_gpu_blocks() == NUM_GPU


def test_get_block_table_numbers_match_blocks():
    bm = make_manager()
    g1 = make_group("a", 3, 2)
    g2 = make_group("b", 9)
    allocate_running(bm, g1)
    allocate_running(bm, g2)
    t1, c1, t2 = bm.get_block_table(g1.first_seq), bm.get_cross_block_table(g1), bm.get_block_table(g2.first_seq)
    assert len(t1) == 1 and len(c1) == 1 and len(t2) == 3
    # Fresh pool hands out the lowest numbers first, all distinct: {0..4}.
    assert sorted(t1 + c1 + t2) == [0, 1, 2, 3, 4]
    assert t1 == [b.block_number for b in bm.block_tables[g1.first_seq.seq_id]]
    with pytest.raises(KeyError):
        bm.get_block_table(make_seq(3))


def test_double_allocate_raises_and_does_not_leak():
    bm = make_manager()
    g = make_group("r", 5, 5)
    bm.allocate(g)  # seqs stay WAITING
    free_after_first = bm.get_num_free_gpu_blocks()
    assert free_after_first == NUM_GPU - 4
    with pytest.raises(ValueError):
        bm.allocate(g)
    assert bm.get_num_free_gpu_blocks() == free_after_first


def test_double_allocate_of_cross_table_raises():
    bm = make_manager()
    g = make_group("r", 5, 5)
    bm.allocate(g)
    # Same request id, a new waiting decoder seq: the cross table already exists.
    g2 = SequenceGroup("r", [make_seq(3)], arrival_time=0.0, encoder_seq=make_seq(5))
    with pytest.raises(ValueError):
        bm.allocate(g2)
    assert bm.get_num_free_gpu_blocks() == NUM_GPU - 4


# --------------------------------------------------------------------- append_slots / fork


def test_append_slots_grows_across_block_boundary():
    bm = make_manager()
    g = make_group("r", 3, 4)
    allocate_running(bm, g)
    seq = g.first_seq
    cross_before = bm.get_cross_block_table(g)
    assert len(bm.get_block_table(seq)) == 1
    grow(seq)  # len 4: still 1 block
    assert bm.can_append_slots(g)
    assert bm.append_slots(seq) == []
    assert len(bm.get_block_table(seq)) == 1
    assert bm.get_num_free_gpu_blocks() == NUM_GPU - 2
    grow(seq)  # len 5: needs a 2nd block
    assert bm.append_slots(seq) == []
    table = bm.get_block_table(seq)
    assert len(table) == 2
    assert table[1] not in cross_before and table[1] != table[0]
    assert bm.get_num_free_gpu_blocks() == NUM_GPU - 3
    for _ in range(4):  # len 9: a 3rd block
        grow(seq)
        assert bm.append_slots(seq) == []
    assert len(bm.get_block_table(seq)) == 3
    assert bm.get_num_free_gpu_blocks() == NUM_GPU - 4
    # The cross table never changes while decoding.
    assert bm.get_cross_block_table(g) == cross_before


def test_fork_shares_blocks_and_cow_on_append():
    bm = make_manager()
    g = make_group("r", 6, 2)  # 2 self blocks, last half full; 1 cross block
    allocate_running(bm, g)
    parent = g.first_seq
    child = parent.fork(next(_ids))
    g.add(child)
    free_before = bm.get_num_free_gpu_blocks()
    bm.fork(parent, child)
    assert bm.get_num_free_gpu_blocks() == free_before  # sharing costs nothing
    parent_blocks = list(blocks_of(bm, parent))
    assert blocks_of(bm, child) == parent_blocks
    assert all(b.ref_count == 2 for b in parent_blocks)
    cross = bm.cross_block_tables["r"]
    assert cross[0].ref_count == 1  # fork does not touch the cross table

    # The child writes into the shared, partially filled last block: copy-on-write.
    grow(child)  # len 7, still 2 blocks
    assert bm.can_append_slots(g)
    pairs = bm.append_slots(child)
    old_last = parent_blocks[-1]
    new_last = blocks_of(bm, child)[-1]
    assert len(pairs) == 1
    assert pairs[0] == (old_last.block_number, new_last.block_number)
    assert new_last is not old_last
    assert new_last.block_number not in [b.block_number for b in parent_blocks]
    assert blocks_of(bm, child)[0] is parent_blocks[0]  # first block still shared
    assert parent_blocks[0].ref_count == 2
    assert old_last.ref_count == 1 and new_last.ref_count == 1
    assert blocks_of(bm, parent) == parent_blocks  # the parent's table is untouched
    assert bm.get_num_free_gpu_blocks() == free_before - 1

    # The parent now owns its last block alone: no copy needed.
    grow(parent)
    assert bm.append_slots(parent) == []
    assert blocks_of(bm, parent) == parent_blocks
    assert bm.get_num_free_gpu_blocks() == free_before - 1


def test_fork_with_full_last_block_grows_instead_of_copying():
    bm = make_manager()
    g = make_group("r", 8)  # 2 full blocks
    allocate_running(bm, g)
    parent = g.first_seq
    child = parent.fork(next(_ids))
    g.add(child)
    bm.fork(parent, child)
    shared = list(blocks_of(bm, parent))
    grow(child)  # len 9 -> new block, the full shared ones are not written
    assert bm.append_slots(child) == []
    assert blocks_of(bm, child)[:2] == shared
    assert len(blocks_of(bm, child)) == 3
    assert all(b.ref_count == 2 for b in shared)
    assert blocks_of(bm, child)[2].ref_count == 1
    assert bm.get_num_free_gpu_blocks() == NUM_GPU - 3


def test_fork_of_unknown_or_existing_child_raises():
    bm = make_manager()
    g = make_group("r", 4)
    allocate_running(bm, g)
    with pytest.raises(ValueError):
        bm.fork(g.first_seq, g.first_seq)
    with pytest.raises(KeyError):
        bm.fork(make_seq(4), make_seq(4))


def test_can_append_slots_counts_running_seqs():
    bm = make_manager(num_gpu=4)
    g = make_group("r", 7, 4)  # 2 + 1 blocks, 1 free
    allocate_running(bm, g)
    assert bm.get_num_free_gpu_blocks() == 1
    assert bm.can_append_slots(g)
    child = g.first_seq.fork(next(_ids))
    g.add(child)
    bm.fork(g.first_seq, child)
    assert not bm.can_append_slots(g)  # 2 running seqs, 1 free block
    child.status = SequenceStatus.FINISHED_STOPPED
    bm.free(child)
    assert bm.can_append_slots(g)
    grow(g.first_seq)
    grow(g.first_seq)  # len 9 -> 3rd self block, pool full
    bm.append_slots(g.first_seq)
    assert bm.get_num_free_gpu_blocks() == 0
    assert not bm.can_append_slots(g)


def test_append_slots_without_free_block_raises():
    bm = make_manager(num_gpu=2)
    g = make_group("r", 8)
    allocate_running(bm, g)
    grow(g.first_seq)
    assert not bm.can_append_slots(g)
    with pytest.raises(RuntimeError):
        bm.append_slots(g.first_seq)


# --------------------------------------------------------------------- swapping


def _snapshot(bm, group):
    return ({s.seq_id: list(bm.block_tables[s.seq_id]) for s in group.get_unfinished_seqs()},
            list(bm.cross_block_tables.get(group.request_id, [])))


def _check_swap(bm, group, before, after, mapping, src_dev, dst_dev):
    self_before, cross_before = before
    self_after, cross_after = after
    distinct_src = {id(b): b for t in list(self_before.values()) + [cross_before] for b in t}
    srcs = [s for s, _ in mapping]
    dsts = [d for _, d in mapping]
    # Each distinct source block exactly once, each to its own destination block.
    assert sorted(srcs) == sorted(b.block_number for b in distinct_src.values())
    assert len(set(srcs)) == len(srcs)
    assert len(set(dsts)) == len(dsts)
    m = dict(mapping)
    for seq_id, table in self_before.items():
        new = self_after[seq_id]
        assert len(new) == len(table)
        assert [m[b.block_number] for b in table] == [b.block_number for b in new]
        assert all(b.device == src_dev for b in table)
        assert all(b.device == dst_dev for b in new)
    assert [m[b.block_number] for b in cross_before] == [b.block_number for b in cross_after]
    assert all(b.device == dst_dev for b in cross_after)


def test_swap_out_and_in_round_trip():
    bm = make_manager()
    other = make_group("other", 4, 4)  # occupies GPU blocks 0, 1
    allocate_running(bm, other)
    g = make_group("r", 6, 9)  # 2 self + 3 cross
    allocate_running(bm, g)
    parent = g.first_seq
    child = parent.fork(next(_ids))
    g.add(child)
    bm.fork(parent, child)
    grow(child)  # cow on child's last block -> 6 distinct blocks in the group
    cow = bm.append_slots(child)
    assert len(cow) == 1
    gpu_free = bm.get_num_free_gpu_blocks()
    assert gpu_free == NUM_GPU - 2 - 6

    assert bm.can_swap_out(g)
    before = _snapshot(bm, g)
    mapping = bm.swap_out(g)
    for s in g.get_seqs(SequenceStatus.RUNNING):
        s.status = SequenceStatus.SWAPPED
    after = _snapshot(bm, g)
    assert len(mapping) == 6
    _check_swap(bm, g, before, after, mapping, Device.GPU, Device.CPU)
    assert bm.get_num_free_gpu_blocks() == gpu_free + 6
    assert bm.get_num_free_cpu_blocks() == NUM_CPU - 6
    assert all(0 <= d < NUM_CPU for _, d in mapping)
    # Sharing is preserved on the CPU side.
    assert blocks_of(bm, parent)[0] is blocks_of(bm, child)[0]
    assert blocks_of(bm, parent)[0].ref_count == 2
    assert blocks_of(bm, parent)[1] is not blocks_of(bm, child)[1]
    # The other request is untouched.
    assert bm.get_block_table(other.first_seq) == [0] and bm.get_cross_block_table(other) == [1]

    assert bm.can_swap_in(g) == AllocStatus.OK
    before_in = _snapshot(bm, g)
    mapping_in = bm.swap_in(g)
    for s in g.get_seqs(SequenceStatus.SWAPPED):
        s.status = SequenceStatus.RUNNING
    after_in = _snapshot(bm, g)
    assert len(mapping_in) == 6
    _check_swap(bm, g, before_in, after_in, mapping_in, Device.CPU, Device.GPU)
    assert bm.get_num_free_gpu_blocks() == gpu_free
    assert bm.get_num_free_cpu_blocks() == NUM_CPU
    # The composite mapping sends every original block's contents to a GPU block in the same table position.
    out, back = dict(mapping), dict(mapping_in)
    for seq_id, table in before[0].items():
        assert [back[out[b.block_number]] for b in table] == [b.block_number for b in after_in[0][seq_id]]
    assert blocks_of(bm, parent)[0] is blocks_of(bm, child)[0]
    assert blocks_of(bm, parent)[0].ref_count == 2
    assert all(b.ref_count == 1 for b in bm.cross_block_tables["r"])

    # And the group keeps decoding on the device afterwards.
    grow(parent)
    assert bm.append_slots(parent) == []
    bm.free(parent)
    bm.free(child)
    bm.free_cross(g)
    bm.free(other.first_seq)
    bm.free_cross(other)
    assert bm.get_num_free_gpu_blocks() == NUM_GPU
    assert bm.get_num_free_cpu_blocks() == NUM_CPU


def test_swap_decoder_only_group():
    bm = make_manager()
    g = make_group("r", 10)
    allocate_running(bm, g)
    mapping = bm.swap_out(g)
    g.first_seq.status = SequenceStatus.SWAPPED
    assert len(mapping) == 3
    assert bm.get_cross_block_table(g) is None
    assert all(b.device == Device.CPU for b in blocks_of(bm, g.first_seq))
    assert bm.get_num_free_gpu_blocks() == NUM_GPU and bm.get_num_free_cpu_blocks() == NUM_CPU - 3


def test_can_swap_out_false_when_cpu_pool_too_small():
    bm = make_manager(num_cpu=4)
    g = make_group("r", 8, 9)  # 2 + 3 = 5 blocks > 4 CPU blocks
    allocate_running(bm, g)
    assert not bm.can_swap_out(g)
    small = make_group("s", 8, 8)  # 4 blocks: exactly fits
    allocate_running(bm, small)
    assert bm.can_swap_out(small)
    bm.swap_out(small)
    small.first_seq.status = SequenceStatus.SWAPPED
    assert bm.get_num_free_cpu_blocks() == 0
    tiny = make_group("t", 1)
    allocate_running(bm, tiny)
    assert not bm.can_swap_out(tiny)


def test_can_swap_out_counts_cross_blocks():
    # Self blocks alone would fit into the CPU pool; with the cross table they do not.
    bm = make_manager(num_cpu=3)
    g = make_group("r", 8, 5)  # 2 self + 2 cross
    allocate_running(bm, g)
    assert not bm.can_swap_out(g)
    d = make_group("d", 8)
    allocate_running(bm, d)
    assert bm.can_swap_out(d)


def test_can_swap_out_counts_shared_blocks_once():
    bm = make_manager(num_cpu=3)
    g = make_group("r", 8, 4)  # 2 self + 1 cross = 3 distinct
    allocate_running(bm, g)
    child = g.first_seq.fork(next(_ids))
    g.add(child)
    bm.fork(g.first_seq, child)  # 5 table entries, still 3 distinct blocks
    assert bm.can_swap_out(g)
    mapping = bm.swap_out(g)
    assert len(mapping) == 3
    assert bm.get_num_free_cpu_blocks() == 0


def test_can_swap_in_later_when_device_full():
    bm = make_manager(num_gpu=8)
    g = make_group("r", 8, 4)  # 3 blocks
    allocate_running(bm, g)
    bm.swap_out(g)
    g.first_seq.status = SequenceStatus.SWAPPED
    filler = make_group("f", 24)  # 6 blocks, 2 free
    allocate_running(bm, filler)
    # Needs 3 blocks + 1 headroom per swapped seq.
    assert bm.can_swap_in(g) == AllocStatus.LATER
    bm.free(filler.first_seq)
    assert bm.can_swap_in(g) == AllocStatus.OK


def test_can_swap_in_keeps_one_block_of_headroom_per_seq():
    bm = make_manager(num_gpu=8)
    g = make_group("r", 8, 4)  # 2 self + 1 cross
    allocate_running(bm, g)
    child = g.first_seq.fork(next(_ids))
    g.add(child)
    bm.fork(g.first_seq, child)  # 2 seqs, still 3 distinct blocks
    bm.swap_out(g)
    for s in g.get_seqs():
        s.status = SequenceStatus.SWAPPED
    filler = make_group("f", 12)  # 3 blocks -> 5 free: 3 blocks + 2 seqs of headroom fits exactly
    allocate_running(bm, filler)
    assert bm.can_swap_in(g) == AllocStatus.OK
    grow(filler.first_seq)  # 4 free: the blocks alone would fit, the headroom does not
    bm.append_slots(filler.first_seq)
    assert bm.get_num_free_gpu_blocks() == 4
    assert bm.can_swap_in(g) == AllocStatus.LATER
    # A swapped group whose blocks plus headroom exceed the whole pool can never come back.
    big = make_group("big", 24, 4)  # 6 + 1 blocks
    bm2 = make_manager(num_gpu=7)
    allocate_running(bm2, big)
    bm2.swap_out(big)
    big.first_seq.status = SequenceStatus.SWAPPED
    assert bm2.get_num_free_gpu_blocks() == 7
    assert bm2.can_swap_in(big) == AllocStatus.NEVER  # 7 blocks + 1 headroom > 7


def test_free_of_swapped_seq_returns_cpu_blocks():
    bm = make_manager()
    g = make_group("r", 8, 8)
    allocate_running(bm, g)
    bm.swap_out(g)
    g.first_seq.status = SequenceStatus.SWAPPED
    assert bm.get_num_free_cpu_blocks() == NUM_CPU - 4
    bm.free(g.first_seq)
    assert bm.get_num_free_cpu_blocks() == NUM_CPU - 2
    bm.free_cross(g)
    assert bm.get_num_free_cpu_blocks() == NUM_CPU
    assert bm.get_num_free_gpu_blocks() == NUM_GPU


# --------------------------------------------------------------------- free / reset


def test_free_and_free_cross_return_exactly_their_blocks():
    bm = make_manager()
    g1 = make_group("a", 5, 9)  # 2 + 3
    g2 = make_group("b", 13, 2)  # 4 + 1
    allocate_running(bm, g1)
    allocate_running(bm, g2)
    assert bm.get_num_free_gpu_blocks() == NUM_GPU - 10
    t1 = set(bm.get_block_table(g1.first_seq))
    c1 = set(bm.get_cross_block_table(g1))
    bm.free(g1.first_seq)
    assert bm.get_num_free_gpu_blocks() == NUM_GPU - 8
    assert {b.block_number for b in bm.gpu_allocator.free_blocks} >= t1
    assert not ({b.block_number for b in bm.gpu_allocator.free_blocks} & c1)
    assert g1.first_seq.seq_id not in bm.block_tables
    assert bm.get_cross_block_table(g1) == sorted(c1)  # untouched
    bm.free_cross(g1)
    assert bm.get_num_free_gpu_blocks() == NUM_GPU - 5
    assert bm.get_cross_block_table(g1) is None
    # g2's tables are intact and none of their blocks is free.
    held = set(bm.get_block_table(g2.first_seq)) | set(bm.get_cross_block_table(g2))
    assert len(held) == 5
    assert not held & {b.block_number for b in bm.gpu_allocator.free_blocks}


def test_free_unknown_seq_is_noop():
    bm = make_manager()
    g = make_group("a", 5, 5)
    allocate_running(bm, g)
    before = bm.get_num_free_gpu_blocks()
    bm.free(make_seq(4))
    bm.free_cross(make_group("unknown", 3, 3))
    assert bm.get_num_free_gpu_blocks() == before
    bm.free(g.first_seq)
    bm.free(g.first_seq)  # second free of the same seq: no-op, no double free
    bm.free_cross(g)
    bm.free_cross(g)
    assert bm.get_num_free_gpu_blocks() == NUM_GPU


def test_reset_restores_both_pools():
    bm = make_manager()
    g1 = make_group("a", 6, 5, num_seqs=2)
    allocate_running(bm, g1)
    child = g1.first_seq.fork(next(_ids))
    g1.add(child)
    bm.fork(g1.first_seq, child)
    g2 = make_group("b", 9, 9)
    allocate_running(bm, g2)
    bm.swap_out(g2)
    g2.first_seq.status = SequenceStatus.SWAPPED
    assert bm.get_num_free_gpu_blocks() < NUM_GPU
    assert bm.get_num_free_cpu_blocks() < NUM_CPU
    bm.reset()
    assert bm.get_num_free_gpu_blocks() == NUM_GPU
    assert bm.get_num_free_cpu_blocks() == NUM_CPU
    assert bm.block_tables == {} and bm.cross_block_tables == {}
    all_blocks = bm.gpu_allocator.free_blocks + bm.cpu_allocator.free_blocks
    assert all(b.ref_count == 0 for b in all_blocks)
    # The pools are usable again from scratch.
    g3 = make_group("c", 64)
    assert bm.can_allocate(g3) == AllocStatus.OK
    allocate_running(bm, g3)
    assert sorted(bm.get_block_table(g3.first_seq)) == list(range(NUM_GPU))
