"""LocalAgreement-2 on hand-made hypotheses: only the common prefix of the last two goes out, beyond what went out
before; a hypothesis that changes an emitted word takes nothing back; the delta texts concatenate to the emitted
words."""
import random

from seq2seq_engine.transcription.live.agreement import LocalAgreement, common_prefix


def feed(agreement, hypotheses):
    out = []
    for words in hypotheses:
        new = agreement.insert(words.split())
        out.append(agreement.delta_text(new))
    return out


def test_the_common_prefix_of_the_last_two_hypotheses_beyond_the_emitted_words():
    agreement = LocalAgreement()
    deltas = feed(agreement, ["the", "the cat", "the cat sat on", "the cat sat on the mat"])
    assert deltas == ["", "the", " cat", " sat on"]
    assert agreement.text == "the cat sat on"


def test_a_hypothesis_that_changes_an_emitted_word_retracts_nothing():
    agreement = LocalAgreement()
    feed(agreement, ["hello word", "hello word how"])
    assert agreement.text == "hello word"
    # the decoder now hears "world": the emitted "word" stays, and nothing beyond it goes out on a disagreeing base
    assert feed(agreement, ["hello world how are", "hello world how are you"]) == ["", ""]
    assert agreement.text == "hello word"
    # later hypotheses that go back to the emitted words extend them again
    assert feed(agreement, ["hello word how are you", "hello word how are you doing"]) == ["", " how are you"]
    assert agreement.text == "hello word how are you"


def test_confirm_emits_the_rest_of_final_words_only_when_the_emitted_words_are_their_prefix():
    agreement = LocalAgreement()
    feed(agreement, ["one two", "one two three"])
    assert agreement.confirm("one two three four".split()) == ["three", "four"]
    assert agreement.delta_text(["three", "four"]) == " three four"
    other = LocalAgreement()
    feed(other, ["one two", "one two three"])
    assert other.confirm("one too three".split()) == []
    assert other.text == "one two"


def test_random_hypotheses_never_retract_and_deltas_concatenate_to_the_emitted_text():
    rng = random.Random(1)
    vocab = ["a", "b", "c", "d"]
    for _ in range(200):
        agreement, sent, texts = LocalAgreement(), "", []
        truth = [rng.choice(vocab) for _ in range(12)]
        for step in range(1, 13):
            words = list(truth[:step])
            if rng.random() < 0.4:  # a noisy hypothesis: one word replaced
                words[rng.randrange(len(words))] = rng.choice(vocab)
            before = list(agreement.emitted)
            sent += agreement.delta_text(agreement.insert(words))
            assert agreement.emitted[:len(before)] == before
            texts.append(words)
        assert sent == agreement.text
        # every emitted word was in the same place in two consecutive hypotheses
        for index, word in enumerate(agreement.emitted):
            assert any(len(common_prefix(a, b)) > index and a[index] == word for a, b in zip(texts, texts[1:]))


def test_holds_while_the_latest_hypothesis_starts_with_the_emitted_words_up_to_case_and_punctuation():
    agreement = LocalAgreement()
    assert not agreement.holds()
    feed(agreement, ["The Quick Brown", "The Quick Brown Fox"])
    assert agreement.holds()
    agreement.insert("the quick, brown fox jumps".split())
    assert agreement.holds()
    agreement.insert("1-2-3 the quick brown".split())
    assert not agreement.holds()
    agreement.insert("The".split())
    assert not agreement.holds()  # shorter than the emitted words
