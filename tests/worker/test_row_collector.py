"""RowCollector: a step scheduling the same decode metadata objects as the step before reuses its lists and syncs
its rows with array operations (InputBatch.sync_decode_rows); every step's rows and counts equal a fresh full
collect's, through new tokens, new blocks, copy-on-write, a re-run without a new token and a list that changes."""
import numpy as np
import pytest

from seq2seq_engine.sampling_params import SamplingParams
from seq2seq_engine.sequence import SequenceData, SequenceGroupMetadata
from seq2seq_engine.worker.input_batch import InputBatch
from seq2seq_engine.worker.scheduled_rows import RowCollector, collect

BLOCK_SIZE = 2
PARAMS = SamplingParams(temperature=0.0)


def _decoding(rng, seq_id, cross=None):
    data = SequenceData(rng.integers(5, 500, size=int(rng.integers(1, 6))).tolist())
    data.update_num_computed_tokens(data.get_len() - 1)
    table = [int(b) for b in rng.integers(0, 100, size=-(-data.get_len() // BLOCK_SIZE))]
    encoder = SequenceData([1, 2, 3]) if cross is not None else None
    return SequenceGroupMetadata(request_id=str(seq_id), is_prompt=False, seq_data={seq_id: data},
                                 sampling_params=PARAMS, block_tables={seq_id: table}, encoder_seq_data=encoder,
                                 cross_block_table=cross)


def _advance(rng, group, step, index):
    """One decode step of the group's sequence, as the engine applies it (sometimes none: a re-run)."""
    (data,), (table,) = group.seq_data.values(), group.block_tables.values()
    if step == 4 and index == 1:
        return                                            # ran its last known token again, gained nothing
    data.update_num_computed_tokens(1)
    data.append_token_id(int(rng.integers(5, 500)), 0.0)
    if -(-data.get_len() // BLOCK_SIZE) > len(table):
        table.append(int(rng.integers(100, 200)))          # grown in place, as append_slots does
    if step == 6 and index == 0:
        table[-1] = int(rng.integers(200, 300))            # copy-on-write of the last block


def _fresh(metadata_list):
    batch = InputBatch(max_num_seqs=8, max_model_len=40, block_size=BLOCK_SIZE)
    scheduled = collect(metadata_list, batch)
    return scheduled, batch


@pytest.mark.parametrize("seed", [0, 1])
def test_repeated_decode_lists_equal_fresh_collects(seed):
    rng = np.random.default_rng(seed)
    groups = [_decoding(rng, i, cross=[7, 8] if i % 2 else None) for i in range(4)]
    batch = InputBatch(max_num_seqs=8, max_model_len=40, block_size=BLOCK_SIZE)
    collector = RowCollector(batch)
    reused = 0
    for step in range(14):
        metadata_list = groups if step != 9 else groups[:3]     # a list that changes: read in full
        previous = collector._last
        scheduled = collector.collect(metadata_list)
        reused += scheduled.sample_params is (previous.sample_params if previous else None)
        want, fresh_batch = _fresh(metadata_list)
        assert scheduled.num_computed == want.num_computed and scheduled.sampled_seq_ids == want.sampled_seq_ids
        assert scheduled.cross_tables == want.cross_tables and scheduled.encoder_lens == want.encoder_lens
        for row, fresh_row, group in zip(scheduled.rows, want.rows, metadata_list):
            (data,), (table,) = group.seq_data.values(), group.block_tables.values()
            assert batch.token_ids[row, :data.get_len()].tolist() == data.get_token_ids()
            assert batch.block_table[row, :len(table)].tolist() == table
            assert (fresh_batch.block_table[fresh_row, :len(table)] == batch.block_table[row, :len(table)]).all()
        for index, group in enumerate(metadata_list):
            _advance(rng, group, step, index)
    assert reused >= 10


def test_a_row_with_two_new_tokens_syncs_alone_and_rows_stay_exact():
    rng = np.random.default_rng(3)
    groups = [_decoding(rng, i) for i in range(3)]
    batch = InputBatch(max_num_seqs=4, max_model_len=40, block_size=BLOCK_SIZE)
    collector = RowCollector(batch)
    collector.collect(groups)
    for index, group in enumerate(groups):
        _advance(rng, group, 0, index)
    _advance(rng, groups[2], 0, 2)                         # two tokens since its last sync
    scheduled = collector.collect(groups)
    for row, group in zip(scheduled.rows, groups):
        (data,), (table,) = group.seq_data.values(), group.block_tables.values()
        assert batch.token_ids[row, :data.get_len()].tolist() == data.get_token_ids()
        assert batch.block_table[row, :len(table)].tolist() == table
