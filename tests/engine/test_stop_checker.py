"""StopChecker: min_tokens, EOS / ignore_eos, stop token ids, stop strings (incl. across increments and
include_stop_str_in_output), max_tokens and max_model_len."""
import pytest

from seq2seq_engine.engine.stop_checker import StopChecker
from seq2seq_engine.inputs.data import SingletonInputs
from seq2seq_engine.sampling_params import SamplingParams
from seq2seq_engine.sequence import Sequence, SequenceStatus
from seq2seq_engine.tokenization.detokenizer import Detokenizer

EOS = 2


def _seq(prompt_len=2):
    seq = Sequence(0, SingletonInputs(prompt_token_ids=list(range(10, 10 + prompt_len))), block_size=4,
                   eos_token_id=EOS)
    seq.status = SequenceStatus.RUNNING
    return seq


def _step(checker, seq, params, token_id, text=""):
    """Append one token whose text is `text` (as the detokenizer would) and run the checker."""
    seq.append_token_id(token_id, {token_id: 0.0})
    seq.output_text += text
    checker.maybe_stop_sequence(seq, len(text), params)


def _run(checker, seq, params, steps):
    for token_id, text in steps:
        _step(checker, seq, params, token_id, text)
        if seq.is_finished():
            break
    return seq


# ----------------------------------------------------------------------------------------------- length caps
def test_max_tokens_caps_exactly_at_max_tokens():
    checker, seq, params = StopChecker(100, EOS), _seq(), SamplingParams(max_tokens=3)
    for i in range(2):
        _step(checker, seq, params, 20 + i, "a")
        assert seq.status == SequenceStatus.RUNNING
    _step(checker, seq, params, 30, "b")
    assert seq.status == SequenceStatus.FINISHED_LENGTH_CAPPED
    assert seq.stop_reason is None and seq.output_text == "aab"
    assert SequenceStatus.get_finished_reason(seq.status) == "length"


def test_max_tokens_none_runs_until_max_model_len():
    checker, seq, params = StopChecker(6, EOS), _seq(prompt_len=3), SamplingParams(max_tokens=None)
    _step(checker, seq, params, 20, "a")
    _step(checker, seq, params, 21, "b")
    assert seq.status == SequenceStatus.RUNNING and seq.get_len() == 5
    _step(checker, seq, params, 22, "c")  # 3 prompt + 3 output tokens = max_model_len
    assert seq.status == SequenceStatus.FINISHED_LENGTH_CAPPED


def test_max_model_len_applies_even_before_min_tokens():
    checker, seq = StopChecker(4, EOS), _seq(prompt_len=2)
    params = SamplingParams(max_tokens=10, min_tokens=5)
    _step(checker, seq, params, 20, "a")
    assert seq.status == SequenceStatus.RUNNING
    _step(checker, seq, params, 21, "b")
    assert seq.status == SequenceStatus.FINISHED_LENGTH_CAPPED


# ----------------------------------------------------------------------------------------------- EOS
def test_eos_stops_and_its_text_is_dropped():
    checker, seq, params = StopChecker(100, EOS), _seq(), SamplingParams(skip_special_tokens=False)
    _run(checker, seq, params, [(20, "hello"), (21, " world"), (EOS, "</s>")])
    assert seq.status == SequenceStatus.FINISHED_STOPPED
    assert seq.stop_reason is None
    assert seq.output_text == "hello world"
    assert SequenceStatus.get_finished_reason(seq.status) == "stop"


def test_eos_with_no_text_and_max_tokens_on_the_same_token_is_a_stop():
    checker, seq, params = StopChecker(100, EOS), _seq(), SamplingParams(max_tokens=2)
    _run(checker, seq, params, [(20, "hi"), (EOS, "")])
    assert seq.status == SequenceStatus.FINISHED_STOPPED and seq.output_text == "hi"


def test_ignore_eos_keeps_going():
    checker, seq, params = StopChecker(100, EOS), _seq(), SamplingParams(ignore_eos=True, max_tokens=4)
    _run(checker, seq, params, [(20, "a"), (EOS, ""), (21, "b")])
    assert seq.status == SequenceStatus.RUNNING
    _step(checker, seq, params, EOS, "")
    assert seq.status == SequenceStatus.FINISHED_LENGTH_CAPPED


def test_eos_from_the_sequence_when_the_checker_has_none():
    checker, seq, params = StopChecker(100, None), _seq(), SamplingParams()
    _run(checker, seq, params, [(20, "a"), (EOS, "")])
    assert seq.status == SequenceStatus.FINISHED_STOPPED


def test_min_tokens_blocks_eos():
    checker, seq, params = StopChecker(100, EOS), _seq(), SamplingParams(min_tokens=3, max_tokens=10)
    _step(checker, seq, params, EOS, "")
    _step(checker, seq, params, EOS, "")
    assert seq.status == SequenceStatus.RUNNING
    _step(checker, seq, params, EOS, "")
    assert seq.status == SequenceStatus.FINISHED_STOPPED


# ----------------------------------------------------------------------------------------------- stop token ids
@pytest.mark.parametrize("include", [False, True])
def test_stop_token_id(include):
    checker, seq = StopChecker(100, EOS), _seq()
    params = SamplingParams(stop_token_ids=[7, 8], include_stop_str_in_output=include)
    _run(checker, seq, params, [(20, "ab"), (21, "cd"), (8, "<x>"), (22, "never")])
    assert seq.status == SequenceStatus.FINISHED_STOPPED
    assert seq.stop_reason == 8
    assert seq.output_text == ("abcd<x>" if include else "abcd")
    assert seq.get_output_len() == 3


def test_min_tokens_blocks_stop_token_ids():
    checker, seq, params = StopChecker(100, EOS), _seq(), SamplingParams(stop_token_ids=[7], min_tokens=2)
    _step(checker, seq, params, 7, "x")
    assert seq.status == SequenceStatus.RUNNING
    _step(checker, seq, params, 7, "x")
    assert seq.status == SequenceStatus.FINISHED_STOPPED and seq.stop_reason == 7 and seq.output_text == "x"


# ----------------------------------------------------------------------------------------------- stop strings
def test_stop_string_within_one_increment():
    checker, seq, params = StopChecker(100, EOS), _seq(), SamplingParams(stop=["STOP"])
    _run(checker, seq, params, [(20, "hello "), (21, "wSTOPorld"), (22, "more")])
    assert seq.status == SequenceStatus.FINISHED_STOPPED
    assert seq.stop_reason == "STOP"
    assert seq.output_text == "hello w"


@pytest.mark.parametrize("include, expected", [(False, "abc "), (True, "abc STOP")])
def test_stop_string_spanning_two_increments(include, expected):
    checker, seq = StopChecker(100, EOS), _seq()
    params = SamplingParams(stop=["STOP"], include_stop_str_in_output=include)
    _step(checker, seq, params, 20, "abc ST")
    assert seq.status == SequenceStatus.RUNNING
    _step(checker, seq, params, 21, "OP tail")
    assert seq.status == SequenceStatus.FINISHED_STOPPED
    assert seq.stop_reason == "STOP"
    assert seq.output_text == expected


def test_stop_string_spanning_three_increments():
    checker, seq, params = StopChecker(100, EOS), _seq(), SamplingParams(stop=["<end>"])
    _run(checker, seq, params, [(20, "x<"), (21, "en"), (22, "d>y")])
    assert seq.status == SequenceStatus.FINISHED_STOPPED and seq.output_text == "x"


def test_earliest_of_several_stop_strings_wins():
    checker, seq, params = StopChecker(100, EOS), _seq(), SamplingParams(stop=["world", "lo"])
    _run(checker, seq, params, [(20, "hel"), (21, "lo world")])
    assert seq.stop_reason == "lo" and seq.output_text == "hel"


def test_stop_string_before_min_tokens_is_not_searched_again():
    checker, seq, params = StopChecker(100, EOS), _seq(), SamplingParams(stop=["ab"], min_tokens=2, max_tokens=5)
    _step(checker, seq, params, 20, "xab")  # before min_tokens: ignored
    assert seq.status == SequenceStatus.RUNNING
    _step(checker, seq, params, 21, "cd")   # the old "ab" is outside the new text's lookback
    assert seq.status == SequenceStatus.RUNNING
    _step(checker, seq, params, 22, "a")
    _step(checker, seq, params, 23, "b!")
    assert seq.status == SequenceStatus.FINISHED_STOPPED
    assert seq.output_text == "xabcd"


def test_no_new_text_no_stop_string_check():
    checker, seq, params = StopChecker(100, EOS), _seq(), SamplingParams(stop=["ab"])
    seq.output_text = "ab"  # text that is not new this step is not searched
    _step(checker, seq, params, 20, "")
    assert seq.status == SequenceStatus.RUNNING


def test_stop_string_wins_over_max_tokens_on_the_same_token():
    checker, seq, params = StopChecker(100, EOS), _seq(), SamplingParams(stop=["!"], max_tokens=2)
    _run(checker, seq, params, [(20, "hi"), (21, " there! ok")])
    assert seq.status == SequenceStatus.FINISHED_STOPPED and seq.stop_reason == "!"
    assert seq.output_text == "hi there"


def test_check_stop_strings_helper():
    assert StopChecker.check_stop_strings("hello world", 5, ["wor"], False) == ("wor", 6)
    assert StopChecker.check_stop_strings("hello world", 5, ["wor"], True) == ("wor", 9)
    assert StopChecker.check_stop_strings("hello world", 3, ["hello"], False) is None
    assert StopChecker.check_stop_strings("hello world", 0, ["world"], False) is None
    assert StopChecker.check_stop_strings("hello world", 2, [], False) is None


# ----------------------------------------------------------------------------------------------- with the detokenizer
def test_stop_string_with_real_detokenization(spm_tokenizer):
    detokenizer, checker = Detokenizer(spm_tokenizer), StopChecker(100, EOS)
    params = SamplingParams(stop=["quick"], max_tokens=50)
    seq = _seq()
    ids = spm_tokenizer.encode("hello world the quick brown fox")
    for token_id in ids:
        seq.append_token_id(token_id, {token_id: 0.0})
        checker.maybe_stop_sequence(seq, detokenizer.decode_sequence_inplace(seq, params), params)
        if seq.is_finished():
            break
    assert seq.status == SequenceStatus.FINISHED_STOPPED and seq.stop_reason == "quick"
    assert seq.output_text == "hello world the "


def test_eos_with_real_detokenization_keeps_no_eos_text(spm_tokenizer):
    detokenizer, checker = Detokenizer(spm_tokenizer), StopChecker(100, EOS)
    for skip in (True, False):
        params = SamplingParams(skip_special_tokens=skip)
        seq = _seq()
        for token_id in spm_tokenizer.encode("hello world") + [EOS]:
            seq.append_token_id(token_id, {token_id: 0.0})
            checker.maybe_stop_sequence(seq, detokenizer.decode_sequence_inplace(seq, params), params)
        assert seq.status == SequenceStatus.FINISHED_STOPPED
        assert seq.output_text == "hello world"
