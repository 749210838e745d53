"""benchmarks/wer.py: jiwer word error rate over text normalised by Whisper's English normalizer."""
import importlib.util
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def wer_module():
    spec = importlib.util.spec_from_file_location("benchmarks_wer", os.path.join(ROOT, "benchmarks", "wer.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_spelled_out_numbers_match_digits(wer_module):
    assert wer_module.wer("I have ten apples", "I have 10 apples") == 0.0
    assert wer_module.normalize("I have ten apples.") == ["i", "have", "10", "apples"]


def test_case_punctuation_contractions_and_fillers_are_not_errors(wer_module):
    assert wer_module.wer("Mr. Smith won't come, um, today!", "mister smith will not come today") == 0.0


def test_real_errors_give_the_exact_rate(wer_module):
    # "the cat sat on the mat" (6 words) -> "the cat sit on mat": sat/sit substituted, the second "the" deleted
    assert wer_module.wer("The cat sat on the mat.", "the cat sit on mat") == pytest.approx(2 / 6)
    # one inserted word over 4 reference words; "ten" and "10" still agree
    assert wer_module.wer("I have ten apples", "I have 10 green apples") == pytest.approx(1 / 4)


def test_corpus_wer_is_total_errors_over_total_reference_words(wer_module):
    pairs = [("I have ten apples", "I have 10 apples"), ("The cat sat on the mat.", "the cat sit on mat")]
    assert wer_module.corpus_wer(pairs) == pytest.approx((0 + 2) / (4 + 6))
    assert wer_module.corpus_wer(iter(pairs)) == pytest.approx(0.2)  # any iterable, as transcribe.py passes one
    assert wer_module.corpus_wer([]) == 0.0
    assert wer_module.wer("", "hello there") == 2.0  # no reference words: the error count itself


def test_inserted_runs_name_each_run_after_its_reference_word(wer_module):
    runs = wer_module.inserted_runs("The cat sat on the mat.", "The cat sat down on the big mat. Thank you!")
    assert runs == ["sat: down", "the: big", "mat: thank you"]
    assert wer_module.inserted_runs("Ten apples.", "10 apples") == []   # the normaliser makes them one word
    assert wer_module.inserted_runs("", "Hello there") == ["hello there"]
    assert wer_module.inserted_runs("a b", "x a b") == ["^: x"]
