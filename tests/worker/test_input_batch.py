"""The input-preparation worked example (block size 2, max model len 12, prompts of 3/2/8, budget 10)."""
import numpy as np

from seq2seq_engine.sequence import SequenceData
from seq2seq_engine.worker.input_batch import InputBatch, prepare_flat_inputs

PROMPTS = [[101, 102, 103], [201, 202], [301, 302, 303, 304, 305, 306, 307, 308]]


def _step(batch, seqs, tables, computed, scheduled):
    rows = np.array([batch.sync(i, seqs[i], tables[i]) for i in range(3)])
    return prepare_flat_inputs(rows, np.array(computed), np.array(scheduled), batch.token_ids,
                               batch.block_table, block_size=2)


def test_worked_example_two_steps():
    batch = InputBatch(max_num_seqs=4, max_model_len=12, block_size=2)
    seqs = [SequenceData(p) for p in PROMPTS]
    # Step 1: the 10-token budget takes all of prompts 0 and 1 and 5 tokens of prompt 2.
    step1 = _step(batch, seqs, [[1, 2], [3], [4, 5, 6]], [0, 0, 0], [3, 2, 5])
    assert step1.slot_mapping.tolist() == [2, 3, 4, 6, 7, 8, 9, 10, 11, 12]
    assert step1.query_start_loc.tolist() == [0, 3, 5, 10]
    assert step1.positions.tolist() == [0, 1, 2, 0, 1, 0, 1, 2, 3, 4]
    assert step1.input_ids.tolist() == PROMPTS[0] + PROMPTS[1] + PROMPTS[2][:5]
    assert step1.seq_lens.tolist() == [3, 2, 5] and step1.num_tokens == 10
    # Requests 0 and 1 sampled a token each; request 2 continues its prompt.
    seqs[0].append_token_id(104, 0.0)
    seqs[1].append_token_id(203, 0.0)
    step2 = _step(batch, seqs, [[1, 2], [3, 7], [4, 5, 6, 8]], [3, 2, 5], [1, 1, 3])
    assert step2.positions.tolist() == [3, 2, 5, 6, 7]
    assert step2.token_indices.tolist() == [3, 14, 29, 30, 31]
    assert step2.slot_mapping.tolist() == [5, 14, 13, 16, 17]
    assert step2.seq_lens.tolist() == [4, 3, 8]
    assert step2.input_ids.tolist() == [104, 203, 306, 307, 308]
    assert step2.block_numbers.tolist() == [2, 7, 6, 8, 8]


def test_rows_are_reused_after_release_and_the_table_grows():
    batch = InputBatch(max_num_seqs=1, max_model_len=8, block_size=4)
    first = batch.sync(10, SequenceData([1, 2, 3]), [0])
    second = batch.sync(11, SequenceData([4, 5]), [1])
    assert first != second and batch.token_ids.shape[0] == 2
    batch.release([10])
    third = batch.sync(12, SequenceData([6]), [2])
    assert third == first and batch.token_ids[third, 0] == 6 and batch.num_live_rows == 2
