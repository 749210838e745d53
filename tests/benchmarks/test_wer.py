"""benchmarks/lib/wer.py: jiwer word error rate over text normalised by Whisper's English normalizer."""
import pytest

from benchmarks.lib import wer


def test_spelled_out_numbers_match_digits():
    assert wer.wer("I have ten apples", "I have 10 apples") == 0.0
    assert wer.normalize("I have ten apples.") == ["i", "have", "10", "apples"]


def test_case_punctuation_contractions_and_fillers_are_not_errors():
    assert wer.wer("Mr. Smith won't come, um, today!", "mister smith will not come today") == 0.0


def test_real_errors_give_the_exact_rate():
    # "the cat sat on the mat" (6 words) -> "the cat sit on mat": sat/sit substituted, the second "the" deleted
    assert wer.wer("The cat sat on the mat.", "the cat sit on mat") == pytest.approx(2 / 6)
    # one inserted word over 4 reference words; "ten" and "10" still agree
    assert wer.wer("I have ten apples", "I have 10 green apples") == pytest.approx(1 / 4)


def test_corpus_wer_is_total_errors_over_total_reference_words():
    pairs = [("I have ten apples", "I have 10 apples"), ("The cat sat on the mat.", "the cat sit on mat")]
    assert wer.corpus_wer(pairs) == pytest.approx((0 + 2) / (4 + 6))
    assert wer.corpus_wer(iter(pairs)) == pytest.approx(0.2)  # any iterable, as transcribe.py passes one
    assert wer.corpus_wer([]) == 0.0
    assert wer.wer("", "hello there") == 2.0  # no reference words: the error count itself


def test_inserted_runs_name_each_run_after_its_reference_word():
    runs = wer.inserted_runs("The cat sat on the mat.", "The cat sat down on the big mat. Thank you!")
    assert runs == ["sat: down", "the: big", "mat: thank you"]
    assert wer.inserted_runs("Ten apples.", "10 apples") == []   # the normaliser makes them one word
    assert wer.inserted_runs("", "Hello there") == ["hello there"]
    assert wer.inserted_runs("a b", "x a b") == ["^: x"]
