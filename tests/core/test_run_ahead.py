"""Which steps may run ahead of the pending tokens (core/run_ahead.py), and the placeholder a pending token holds."""
import pytest
from block_manager_utils import make_group

from seq2seq_engine.core.run_ahead import can_schedule_ahead, decodes_ahead, ends_by_length
from seq2seq_engine.sampling.beam_search import BeamSearchState
from seq2seq_engine.sampling_params import SamplingParams
from seq2seq_engine.sequence_data import PLACEHOLDER_TOKEN_ID, SequenceData, SequenceStatus


def _decoding(request_id="r", num_seqs=1, **params):
    group = make_group(request_id, dec_len=5, enc_len=3, num_seqs=num_seqs)
    group.sampling_params = SamplingParams(**params)
    for seq in group.get_seqs():
        seq.status = SequenceStatus.RUNNING
        seq.data.update_num_computed_tokens(4)
        seq.data.update_num_computed_tokens(1)   # the whole prompt computed: decoding
        seq.append_token_id(9, {9: -0.1})
    return group


def test_a_plain_decode_runs_ahead_and_what_needs_the_token_does_not():
    assert decodes_ahead(_decoding())
    assert decodes_ahead(_decoding(temperature=0.8, seed=3, min_tokens=4, logit_bias={5: 1.0}, stop=["x"]))
    assert not decodes_ahead(_decoding(num_seqs=2))
    assert not decodes_ahead(_decoding(repetition_penalty=1.2))
    assert not decodes_ahead(_decoding(no_repeat_ngram_size=2))
    assert not decodes_ahead(_decoding(frequency_penalty=0.5))
    assert not decodes_ahead(_decoding(logits_processors=[lambda ids, logits: logits]))
    beams = _decoding()
    beams.beam_search = BeamSearchState.__new__(BeamSearchState)
    assert not decodes_ahead(beams)
    prefilling = _decoding()
    prefilling.first_seq.data.reset_state_for_recompute()
    assert not decodes_ahead(prefilling)


@pytest.mark.parametrize("waiting, swapped, free_blocks, budget, expected", [
    (0, 0, 3, 100, True), (1, 0, 3, 100, False), (0, 1, 3, 100, False), (0, 0, 2, 100, False), (0, 0, 3, 2, False)])
def test_a_step_runs_ahead_only_without_choices_the_pending_tokens_could_change(
        waiting, swapped, free_blocks, budget, expected):
    running = [_decoding(str(i)) for i in range(3)]
    assert can_schedule_ahead(running, waiting, swapped, free_blocks, budget) is expected
    assert not can_schedule_ahead([], 0, 0, 3, 100)
    assert not can_schedule_ahead(running[:2] + [_decoding("p", presence_penalty=0.3)], 0, 0, 3, 100)


def test_ends_by_length_when_the_next_token_reaches_a_cap():
    group = _decoding(max_tokens=3)     # one output token so far: the next is the second
    seq = group.first_seq
    assert not ends_by_length(seq, group.sampling_params, max_model_len=100)
    seq.append_token_id(9, {9: -0.1})
    assert ends_by_length(seq, group.sampling_params, max_model_len=100)    # the third reaches max_tokens
    assert ends_by_length(_decoding().first_seq, SamplingParams(max_tokens=None), max_model_len=7)
    assert not ends_by_length(_decoding().first_seq, SamplingParams(max_tokens=None), max_model_len=8)


def test_a_placeholder_holds_the_place_and_is_taken_back_exactly():
    data = SequenceData([1, 2, 3])
    data.update_num_computed_tokens(3)
    data.append_token_id(7, -0.5)
    before = (data.get_len(), data.get_num_computed_tokens(), data.cumulative_logprob, list(data.output_token_ids))
    data.append_placeholder()
    assert data.output_token_ids[-1] == PLACEHOLDER_TOKEN_ID
    assert (data.get_len(), data.get_num_computed_tokens()) == (before[0] + 1, before[1] + 1)
    assert data.drop_placeholder()
    assert (data.get_len(), data.get_num_computed_tokens(), data.cumulative_logprob,
            list(data.output_token_ids)) == before
    assert not data.drop_placeholder()      # nothing held: nothing changes
    assert data.get_len() == before[0]
