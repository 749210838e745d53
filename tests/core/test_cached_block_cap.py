"""The cap on free blocks that keep cached content (CacheConfig.max_cached_blocks, decisions §29): a stream of
requests with new encoder inputs reuses the blocks already written instead of writing new ones, the newest cross
tables stay cached and hit (the engine's setting: tests/engine/test_kv_cache_outputs.py)."""
from __future__ import annotations

from block_manager_utils import BLOCK_SIZE, NUM_CPU, allocate_running, new_seq_id

from seq2seq_engine.core.block_manager import BlockSpaceManager
from seq2seq_engine.inputs.data import SingletonInputs
from seq2seq_engine.sequence import Sequence, SequenceGroup

CAP = 6


def _run_and_finish(bm, request_id, encoder_token):
    """A request whose encoder input (3 blocks) is new unless `encoder_token` was seen: admitted, prefilled,
    finished; returns whether its cross table was found cached."""
    seq = Sequence(new_seq_id(), SingletonInputs(prompt_token_ids=[5] * 5), BLOCK_SIZE)
    encoder = Sequence(new_seq_id(), SingletonInputs(prompt_token_ids=[encoder_token] * (3 * BLOCK_SIZE)), BLOCK_SIZE)
    group = SequenceGroup(request_id, [seq], arrival_time=0.0, encoder_seq=encoder)
    allocate_running(bm, group)
    hit = bm.is_cross_computed(group)
    bm.mark_computed(group, seq.get_len())
    bm.free(seq)
    bm.free_cross(group)
    return hit


def test_new_encoder_inputs_reuse_written_blocks_and_the_newest_tables_stay_cached():
    bm = BlockSpaceManager(BLOCK_SIZE, 64, NUM_CPU, watermark=0.0, enable_encoder_cache=True,
                           max_cached_blocks=CAP)
    touched = set()
    allocate = bm.gpu_allocator.allocate

    def recording_allocate():
        block = allocate()
        touched.add(block.block_number)
        return block

    bm.gpu_allocator.allocate = recording_allocate
    for index in range(40):
        assert not _run_and_finish(bm, f"r{index}", 100 + index)
        assert bm.gpu_allocator.get_num_evictable_blocks() <= CAP
    # a request holds its self blocks and 3 cross blocks; the 2 newest cross tables (6 blocks) stay cached
    self_blocks = -(-5 // BLOCK_SIZE)
    assert len(touched) == self_blocks + 3 + CAP, sorted(touched)
    assert _run_and_finish(bm, "again-newest", 139) and _run_and_finish(bm, "again-second", 138)
    assert not _run_and_finish(bm, "again-old", 100)


def test_without_a_cap_every_new_encoder_input_writes_new_blocks():
    bm = BlockSpaceManager(BLOCK_SIZE, 200, NUM_CPU, watermark=0.0, enable_encoder_cache=True)
    for index in range(40):
        _run_and_finish(bm, f"r{index}", 100 + index)
    assert bm.gpu_allocator.get_num_evictable_blocks() == 40 * 3
