"""Example-based tests of the paged KV-cache block manager: swapping groups between the device and CPU pools,
freeing self and cross blocks."""
from __future__ import annotations

from block_manager_utils import (NUM_CPU, NUM_GPU, allocate_running, blocks_of, grow, make_group, make_manager,
                                 make_seq, new_seq_id)

from seq2seq_engine.core.block import Device
from seq2seq_engine.core.block_manager import AllocStatus
from seq2seq_engine.sequence import SequenceStatus


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


def _swap_and_check(bm, group, to_cpu: bool):
    """swap_out (to_cpu) or swap_in the group, move its sequences' status along as the scheduler does, and check the
    mapping with _check_swap; returns (snapshot before, snapshot after, mapping)."""
    before = _snapshot(bm, group)
    mapping = bm.swap_out(group) if to_cpu else bm.swap_in(group)
    old, new = ((SequenceStatus.RUNNING, SequenceStatus.SWAPPED) if to_cpu
                else (SequenceStatus.SWAPPED, SequenceStatus.RUNNING))
    for seq in group.get_seqs(old):
        seq.status = new
    after = _snapshot(bm, group)
    _check_swap(bm, group, before, after, mapping, *((Device.GPU, Device.CPU) if to_cpu else (Device.CPU, Device.GPU)))
    return before, after, mapping


def test_swap_out_and_in_round_trip():
    bm = make_manager()
    other = make_group("other", 4, 4)  # occupies GPU blocks 0, 1
    allocate_running(bm, other)
    g = make_group("r", 6, 9)  # 2 self + 3 cross
    allocate_running(bm, g)
    parent = g.first_seq
    child = parent.fork(new_seq_id())
    g.add(child)
    bm.fork(parent, child)
    grow(child)  # cow on child's last block -> 6 distinct blocks in the group
    cow = bm.append_slots(child)
    assert len(cow) == 1
    gpu_free = bm.get_num_free_gpu_blocks()
    assert gpu_free == NUM_GPU - 2 - 6

    assert bm.can_swap_out(g)
    before, _, mapping = _swap_and_check(bm, g, to_cpu=True)
    assert len(mapping) == 6
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
    _, after_in, mapping_in = _swap_and_check(bm, g, to_cpu=False)
    assert len(mapping_in) == 6
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
    child = g.first_seq.fork(new_seq_id())
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
    child = g.first_seq.fork(new_seq_id())
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


# --------------------------------------------------------------------- free


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


def test_cross_block_numbers_follow_swaps_and_reallocation():
    bm = make_manager()
    allocate_running(bm, make_group("front", 4, 8))  # the next tables start past GPU block 0
    g = make_group("r", 6, 16)
    allocate_running(bm, g)
    on_device = bm.get_cross_block_table(g)
    assert on_device == [b.block_number for b in bm.cross_block_tables["r"]]
    assert bm.get_cross_block_table(g) == on_device  # read again, unchanged
    _swap_and_check(bm, g, to_cpu=True)
    on_cpu = bm.get_cross_block_table(g)
    assert on_cpu == [b.block_number for b in bm.cross_block_tables["r"]] and on_cpu != on_device
    _swap_and_check(bm, g, to_cpu=False)
    assert bm.get_cross_block_table(g) == [b.block_number for b in bm.cross_block_tables["r"]]
    bm.free(g.first_seq)
    bm.free_cross(g)
    assert bm.get_cross_block_table(g) is None
    again = make_group("r", 6, 9)  # the same request id allocated again gets its new table's numbers
    allocate_running(bm, again)
    assert bm.get_cross_block_table(again) == [b.block_number for b in bm.cross_block_tables["r"]]
    assert len(bm.get_cross_block_table(again)) == 3
