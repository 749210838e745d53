"""InputBatch.sync_decode: a decode step writes only its new token and blocks, and falls back to a full sync whenever
that would be wrong (another block list, several new tokens, a released row); the rows always equal a fresh sync's."""
import numpy as np
import pytest

from seq2seq_engine.sequence import SequenceData
from seq2seq_engine.worker.input_batch import InputBatch


def _fresh_rows(seqs, tables):
    """The rows a new batch writes for these sequences with full syncs: the reference."""
    reference = InputBatch(max_num_seqs=4, max_model_len=32, block_size=2)
    rows = [reference.sync(i, data, table) for i, (data, table) in enumerate(zip(seqs, tables))]
    return reference.token_ids[rows], reference.block_table[rows]


def _assert_rows_equal(batch, rows, seqs, tables):
    tokens, blocks = _fresh_rows(seqs, tables)
    for row, data, table, want_tokens, want_blocks in zip(rows, seqs, tables, tokens, blocks):
        length = data.get_len()
        assert batch.token_ids[row, :length].tolist() == want_tokens[:length].tolist()
        assert batch.block_table[row, :len(table)].tolist() == want_blocks[:len(table)].tolist()
        assert batch.prompt_lens[row] == data.get_prompt_len()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_decode_steps_match_full_syncs(seed):
    rng = np.random.default_rng(seed)
    batch = InputBatch(max_num_seqs=2, max_model_len=32, block_size=2)   # grows to 4 rows below
    seqs = [SequenceData(rng.integers(5, 500, size=n).tolist()) for n in (3, 4, 1)]
    tables = [[int(b) for b in rng.integers(0, 100, size=-(-s.get_len() // 2))] for s in seqs]
    rows = [batch.sync(i, data, table) for i, (data, table) in enumerate(zip(seqs, tables))]
    for step in range(12):
        for i, (data, table) in enumerate(zip(seqs, tables)):
            data.append_token_id(int(rng.integers(5, 500)), 0.0)
            if -(-data.get_len() // 2) > len(table):
                table.append(int(rng.integers(100, 200)))       # grown in place, as append_slots does
            if step == 5 and i == 1:
                table[-1] = int(rng.integers(200, 300))         # a copy-on-write of the last block
            if step == 7 and i == 2:
                tables[i] = table = [b + 1000 for b in table]   # a swap: another list
            if step == 9 and i == 0:
                data.append_token_id(7, 0.0)                    # two new tokens since the last sync
                if -(-data.get_len() // 2) > len(table):
                    table.append(int(rng.integers(100, 200)))
            assert batch.sync_decode(i, data, table) == rows[i]
        _assert_rows_equal(batch, rows, seqs, tables)


def test_released_row_is_written_whole_for_its_next_sequence():
    batch = InputBatch(max_num_seqs=1, max_model_len=8, block_size=2)
    first, table = SequenceData([11, 12, 13]), [4, 5]
    row = batch.sync(0, first, table)
    batch.release([0])
    second = SequenceData([21, 22, 23])
    second.append_token_id(24, 0.0)
    assert batch.sync_decode(1, second, table) == row     # same list object, but a new sequence: full sync
    assert batch.token_ids[row, :4].tolist() == [21, 22, 23, 24]


def test_too_long_sequence_is_refused():
    batch = InputBatch(max_num_seqs=1, max_model_len=4, block_size=2)
    data, table = SequenceData([1, 2, 3, 4]), [0, 1]
    batch.sync(0, data, table)
    data.append_token_id(5, 0.0)
    table.append(2)
    with pytest.raises(ValueError, match="max_model_len=4"):
        batch.sync_decode(0, data, table)
