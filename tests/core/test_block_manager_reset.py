"""BlockSpaceManager.reset(): every self and cross table freed at once (forked, grown, swapped out, sharing a cached
encoder entry or prefix blocks), every device and CPU block free, the caches empty, and the manager then handing
out the same blocks as a new one. The stateful tests (test_block_manager_properties.py, test_kv_cache_properties.py)
reset at random points too."""
from __future__ import annotations

from block_manager_utils import (BLOCK_SIZE, NUM_CPU, NUM_GPU, allocate_running, grow, make_group, make_manager,
                                 new_seq_id)

from seq2seq_engine.core.block_manager import AllocStatus, BlockSpaceManager
from seq2seq_engine.inputs.data import SingletonInputs
from seq2seq_engine.sequence import Sequence, SequenceGroup, SequenceStatus


def _fork(bm, group):
    parent = group.first_seq
    child = parent.fork(new_seq_id())
    group.add(child)
    bm.fork(parent, child)
    return child


def _swap_out(bm, group):
    assert bm.can_swap_out(group)
    bm.swap_out(group)
    for seq in group.get_seqs(SequenceStatus.RUNNING):
        seq.status = SequenceStatus.SWAPPED


def _assert_all_free(bm, num_gpu, num_cpu):
    assert bm.block_tables == {} and bm.cross_block_tables == {} and bm.cross_entries == {}
    assert bm.get_num_free_gpu_blocks() == num_gpu and bm.get_num_free_cpu_blocks() == num_cpu
    for allocator, total in ((bm.gpu_allocator, num_gpu), (bm.cpu_allocator, num_cpu)):
        assert allocator.get_num_evictable_blocks() == 0
        assert sorted(block.block_number for block in allocator.free_blocks) == list(range(total))
        assert all(block.ref_count == 0 and block.cache_key is None for block in allocator.free_blocks)


def _tables_after_the_same_work(bm):
    """Block numbers of what a few new requests get: admitted (encoder/decoder and decoder-only), forked, grown, one
    swapped out."""
    first, second = make_group("new-1", 6, 9), make_group("new-2", 5)
    for group in (first, second):
        assert bm.can_allocate(group) == AllocStatus.OK
        allocate_running(bm, group)
    child = _fork(bm, first)
    grow(child)
    copies = bm.append_slots(child)
    swapped = bm.swap_out(second)
    tables = [bm.get_block_table(seq) for seq in first.get_seqs() + second.get_seqs()]
    return tables, bm.get_cross_block_table(first), copies, swapped


def test_reset_frees_forked_grown_and_swapped_tables_and_acts_as_a_new_manager():
    bm = make_manager()
    encoder_decoder = make_group("a", 6, 9)   # 2 self + 3 cross blocks
    decoder_only = make_group("b", 7)         # 2 self blocks
    swapped = make_group("c", 5, 4)           # 2 self + 1 cross, then on CPU
    for group in (encoder_decoder, decoder_only, swapped):
        allocate_running(bm, group)
    for group in (encoder_decoder, swapped):
        grow(_fork(bm, group))
    for seq in encoder_decoder.get_seqs() + swapped.get_seqs():
        bm.append_slots(seq)
    _swap_out(bm, swapped)
    assert bm.get_num_free_gpu_blocks() < NUM_GPU and bm.get_num_free_cpu_blocks() < NUM_CPU

    bm.reset()

    _assert_all_free(bm, NUM_GPU, NUM_CPU)
    assert _tables_after_the_same_work(bm) == _tables_after_the_same_work(make_manager())
    bm.reset()  # twice, and with nothing swapped in between
    _assert_all_free(bm, NUM_GPU, NUM_CPU)


def test_reset_of_a_new_manager_leaves_it_new():
    bm = make_manager(num_gpu=8, num_cpu=0)
    bm.reset()
    _assert_all_free(bm, 8, 0)
    whole_pool = make_group("whole", 8 * BLOCK_SIZE)
    assert bm.can_allocate(whole_pool) == AllocStatus.OK
    allocate_running(bm, whole_pool)
    assert bm.get_block_table(whole_pool.first_seq) == list(range(8))


def _caching_manager():
    return BlockSpaceManager(BLOCK_SIZE, NUM_GPU, NUM_CPU, watermark=0.0, enable_prefix_caching=True,
                             enable_encoder_cache=True)


def _request(request_id, prompt, encoder, num_seqs=1):
    seqs = [Sequence(new_seq_id(), SingletonInputs(prompt_token_ids=prompt), BLOCK_SIZE) for _ in range(num_seqs)]
    encoder_seq = Sequence(new_seq_id(), SingletonInputs(prompt_token_ids=encoder), BLOCK_SIZE)
    return SequenceGroup(request_id, seqs, arrival_time=0.0, encoder_seq=encoder_seq)


def _prefilled(bm, request_id, prompt, encoder, num_seqs=1):
    group = _request(request_id, prompt, encoder, num_seqs)
    allocate_running(bm, group)
    bm.mark_computed(group, group.first_seq.get_len())
    return group


def test_reset_empties_the_prefix_and_encoder_caches():
    bm = _caching_manager()
    finished = _prefilled(bm, "finished", [7] * 9, [11] * 6)
    for seq in finished.get_seqs():
        bm.free(seq)
    bm.free_cross(finished)  # its two full prompt blocks and its cross table stay cached, evictable
    _prefilled(bm, "running", [8] * 9, [12] * 6, num_seqs=2)
    swapped = _prefilled(bm, "swapped", [8] * 10, [12] * 6)  # hits the running one's prefix and cross table
    assert bm.is_cross_computed(swapped) and swapped.first_seq.data.get_num_computed_tokens() == 2 * BLOCK_SIZE
    _swap_out(bm, swapped)  # its self tables go to CPU, the shared cross table stays
    assert bm.gpu_allocator.get_num_evictable_blocks() == 2 + 2  # "finished"'s prompt blocks and cross table
    assert len(bm.prefix_cache.blocks) == 4 and len(bm.cross_cache.entries) == 2
    counts = (bm.cross_cache.num_queries, bm.cross_cache.num_hits, bm.prefix_cache.num_hit_tokens)

    bm.reset()

    _assert_all_free(bm, NUM_GPU, NUM_CPU)
    assert bm.prefix_cache.blocks == {} and bm.cross_cache.entries == {}
    for prompt, encoder in (([7] * 9, [11] * 6), ([8] * 9, [12] * 6)):
        again = _request("again", prompt, encoder)
        assert bm.runs_encoder(again) and bm.num_cached_prefix_tokens(again) == 0  # computed again from scratch
    assert (bm.cross_cache.num_queries, bm.cross_cache.num_hits, bm.prefix_cache.num_hit_tokens) == counts
    assert _tables_after_the_same_work(bm) == _tables_after_the_same_work(_caching_manager())
