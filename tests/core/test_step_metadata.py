"""A one-sequence decode keeps its metadata between steps while its tables stand, the block-number lists it holds
follow appends and copy-on-writes, and a replaced table (swap) or another sequence gets new metadata."""
from block_manager_utils import allocate_running, grow, make_group, make_manager

from seq2seq_engine.core.step_metadata import StepMetadata
from seq2seq_engine.sequence import SequenceStatus


def _decoding(bm, request_id, dec_len, enc_len):
    group = make_group(request_id, dec_len, enc_len)
    allocate_running(bm, group)
    group.first_seq.data.update_num_computed_tokens(dec_len)    # prefilled: decoding from now on
    return group


def _first_decode(bm):
    """(group, its sequence, the StepMetadata, the records of its first decode step) of a 3-token decoder prompt
    over a 5-token encoder input."""
    group = _decoding(bm, "r", 3, 5)
    metadata = StepMetadata(bm)
    return group, group.first_seq, metadata, metadata.single_decode(group, group.first_seq)


def test_kept_between_steps_and_lists_follow_appends():
    bm = make_manager()
    group, seq, metadata, first = _first_decode(bm)
    assert first.scheduled.token_chunk_size == 1 and not first.scheduled.is_prompt
    for _ in range(3):   # 3 -> 6 tokens: a second block (block size 4)
        grow(seq)
        bm.append_slots(seq)
        again = metadata.single_decode(group, seq)
        assert again.metadata is first.metadata and again.scheduled is first.scheduled
    block_numbers = [block.block_number for block in bm.block_tables[seq.seq_id]]
    assert len(block_numbers) == 2
    assert first.metadata.block_tables[seq.seq_id] == block_numbers
    assert first.metadata.cross_block_table == [block.block_number for block in bm.cross_block_tables["r"]]
    assert first.metadata.seq_data[seq.seq_id] is seq.data and first.metadata.do_sample


def test_copy_on_write_updates_the_kept_list():
    bm = make_manager()
    group = _decoding(bm, "r", 2, None)
    parent = group.first_seq
    kept = bm.get_block_table(parent)
    child = parent.fork(99)
    bm.fork(parent, child)
    grow(parent)
    copies = bm.append_slots(parent)          # the shared last block is copied for the parent
    assert len(copies) == 1 and kept[-1] == copies[0][1]
    assert kept == [block.block_number for block in bm.block_tables[parent.seq_id]]


def test_swap_and_forget_rebuild():
    bm = make_manager()
    group, seq, metadata, first = _first_decode(bm)
    bm.swap_out(group)
    seq.status = SequenceStatus.SWAPPED
    bm.swap_in(group)
    seq.status = SequenceStatus.RUNNING
    swapped = metadata.single_decode(group, seq)
    assert swapped.metadata is not first.metadata
    assert swapped.metadata.block_tables[seq.seq_id] == [b.block_number for b in bm.block_tables[seq.seq_id]]
    metadata.forget("r")
    assert metadata.single_decode(group, seq).metadata is not swapped.metadata
