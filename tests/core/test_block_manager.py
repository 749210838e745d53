"""Example-based tests of the paged KV-cache block manager (self tables per decoder sequence,
one cross table per encoder/decoder request, device and CPU pools): allocation, appends, forks.
Swapping and freeing are in test_block_manager_swap.py, the allocator of one pool in test_block.py."""
from __future__ import annotations

import pytest
from block_manager_utils import (NUM_CPU, NUM_GPU, allocate_running, blocks_of, grow, make_group, make_manager,
                                 make_seq, new_seq_id)

from seq2seq_engine.core.block import Device
from seq2seq_engine.core.block_manager import AllocStatus
from seq2seq_engine.sequence import SequenceGroup, SequenceStatus

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
    child = parent.fork(new_seq_id())
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
    child = parent.fork(new_seq_id())
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


def test_can_append_slots_counts_the_blocks_append_slots_takes():
    bm = make_manager(num_gpu=4)
    g = make_group("r", 7, 4)  # 2 + 1 blocks, 1 free
    allocate_running(bm, g)
    assert bm.can_append_slots(g)  # a prefill: its blocks were allocated at admission
    g.first_seq.data.update_num_computed_tokens(7)  # prefill done: decode steps from here
    assert not g.is_prefill() and bm.get_num_free_gpu_blocks() == 1
    assert bm.can_append_slots(g)
    child = g.first_seq.fork(new_seq_id())
    g.add(child)
    bm.fork(g.first_seq, child)
    grow(g.first_seq)
    grow(child)  # len 8: both write the shared last block, so each needs a copy: 2 blocks, 1 free
    assert not bm.can_append_slots(g)
    child.status = SequenceStatus.FINISHED_STOPPED
    bm.free(child)
    assert bm.can_append_slots(g)  # the last block is its own again and has room: no block needed
    bm.append_slots(g.first_seq)
    grow(g.first_seq)  # len 9 -> a 3rd self block, the last free one
    assert bm.can_append_slots(g)
    bm.append_slots(g.first_seq)
    assert bm.get_num_free_gpu_blocks() == 0
    assert bm.can_append_slots(g)  # token 10 fits the 3rd block: a full pool still decodes
    for _ in range(4):
        grow(g.first_seq)  # len 13 -> a 4th block, none free
    assert not bm.can_append_slots(g)


def test_append_slots_without_free_block_raises():
    bm = make_manager(num_gpu=2)
    g = make_group("r", 8)
    allocate_running(bm, g)
    grow(g.first_seq)
    assert not bm.can_append_slots(g)
    with pytest.raises(RuntimeError):
        bm.append_slots(g.first_seq)
