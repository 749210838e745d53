"""Incremental detokenization against tokenizer.decode, with the sentencepiece fixture and an offline-trained
byte-level BPE tokenizer (multi-byte UTF-8), plus get_tokenizer from a local directory."""
import random

import pytest

from seq2seq_engine.inputs.data import SingletonInputs
from seq2seq_engine.sampling_params import SamplingParams
from seq2seq_engine.sequence import Sequence
from seq2seq_engine.tokenization.detokenizer import Detokenizer, detokenize_incrementally
from seq2seq_engine.tokenization.tokenizer import get_tokenizer

REPLACEMENT = "\ufffd"
MULTIBYTE_LINES = ["héllo wörld 日本語 ça va? naïve café", "Grüße aus Köln — “quotes” and 😀 emoji",
                   "東京は晴れ, Ελληνικά, русский текст",
                   "señor año über façade ℃ ∑ → ✓"]


@pytest.fixture(scope="module")
def bpe_tokenizer():
    """A byte-level BPE tokenizer (GPT-2/Whisper style) trained here, wrapped as a transformers fast tokenizer."""
    tokenizers = pytest.importorskip("tokenizers")
    transformers = pytest.importorskip("transformers")
    rng = random.Random(0)
    words = "the quick brown fox jumps over lazy dog encoder decoder audio speech hello world".split()
    lines = [" ".join(rng.choice(words) for _ in range(rng.randint(3, 10))) for _ in range(300)]
    lines += MULTIBYTE_LINES * 20
    trainer = tokenizers.ByteLevelBPETokenizer()
    trainer.train_from_iterator(lines, vocab_size=420, min_frequency=1,
                                special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<|en|>"])
    return transformers.PreTrainedTokenizerFast(tokenizer_object=trainer._tokenizer, bos_token="<s>",
                                                eos_token="</s>", pad_token="<pad>", unk_token="<unk>",
                                                additional_special_tokens=["<|en|>"],
                                                clean_up_tokenization_spaces=False)


def _make_seq(prompt_ids=(2, 0)):
    return Sequence(0, SingletonInputs(prompt_token_ids=list(prompt_ids)), block_size=4)


def _decode_token_by_token(tokenizer, token_ids, skip_special_tokens, prompt_ids=(2, 0)):
    """Feed the ids one by one through Detokenizer, as the engine does; check the returned counts on the way."""
    detokenizer = Detokenizer(tokenizer)
    params = SamplingParams(skip_special_tokens=skip_special_tokens)
    seq = _make_seq(prompt_ids)
    for token_id in token_ids:
        before = seq.output_text
        seq.append_token_id(token_id, {token_id: 0.0})
        count = detokenizer.decode_sequence_inplace(seq, params)
        assert seq.output_text[:len(before)] == before
        assert len(seq.output_text) - len(before) == count
        assert not seq.output_text.endswith(REPLACEMENT)
    return seq.output_text


def _random_ids(rng, vocab_size, max_len=40):
    return [rng.randrange(vocab_size) for _ in range(rng.randint(1, max_len))]


# ----------------------------------------------------------------------------------------------- sentencepiece
@pytest.mark.parametrize("skip_special_tokens", [True, False])
def test_spm_random_sequences_match_decode(spm_tokenizer, skip_special_tokens):
    rng = random.Random(1)
    vocab_size = len(spm_tokenizer)
    for _ in range(150):
        ids = _random_ids(rng, vocab_size)
        if rng.random() < 0.5:  # make sure special tokens show up, also first and last
            ids = [rng.choice([0, 1, 2, 3])] + ids + [rng.choice([0, 2])]
        expected = spm_tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)
        assert _decode_token_by_token(spm_tokenizer, ids, skip_special_tokens) == expected, ids


def test_spm_encoded_text_round_trips(spm_tokenizer):
    for text in ["hello world the quick brown fox", "encoder decoder audio speech", "kalo mine the and ruvi"]:
        ids = spm_tokenizer.encode(text)
        assert _decode_token_by_token(spm_tokenizer, ids, True) == spm_tokenizer.decode(ids, skip_special_tokens=True)
        assert (_decode_token_by_token(spm_tokenizer, ids + [2], True)
                == spm_tokenizer.decode(ids, skip_special_tokens=True))


def test_decoder_prompt_is_not_part_of_the_output(spm_tokenizer):
    prompt = spm_tokenizer.encode("hello world")
    ids = spm_tokenizer.encode("the quick brown fox")
    expected = spm_tokenizer.decode(ids, skip_special_tokens=True)
    assert _decode_token_by_token(spm_tokenizer, ids, True, prompt_ids=[2, 0] + prompt) == expected
    assert not expected.startswith("hello")


def test_detokenize_incrementally_function(spm_tokenizer):
    ids = spm_tokenizer.encode("hello world the quick")
    tokens, prefix_offset, read_offset, text = None, 0, 0, ""
    for i in range(1, len(ids) + 1):
        new_tokens, new_text, prefix_offset, read_offset = detokenize_incrementally(
            spm_tokenizer, ids[:i], tokens, prefix_offset, read_offset, skip_special_tokens=True)
        tokens = new_tokens if tokens is None else tokens + new_tokens
        text += new_text
        assert 0 <= prefix_offset <= read_offset <= len(tokens)
    assert tokens == spm_tokenizer.convert_ids_to_tokens(ids)
    assert text == "hello world the quick"


def test_first_call_decodes_every_pending_token(spm_tokenizer):
    """Tokens appended before the first decode all come out in that first call."""
    ids = spm_tokenizer.encode("hello world the")
    seq = _make_seq()
    for token_id in ids:
        seq.append_token_id(token_id, {token_id: 0.0})
    count = Detokenizer(spm_tokenizer).decode_sequence_inplace(seq, SamplingParams())
    assert seq.output_text == "hello world the" and count == len("hello world the")


def test_ids_beyond_the_tokenizer_vocabulary_decode_to_nothing(spm_tokenizer):
    big = len(spm_tokenizer) + 10  # models often pad their vocabulary past the tokenizer's
    ids = spm_tokenizer.encode("hello") + [big] + spm_tokenizer.encode("world")
    assert _decode_token_by_token(spm_tokenizer, ids, True) == "hello world"


def test_no_tokens_no_text(spm_tokenizer):
    seq = _make_seq()
    assert Detokenizer(spm_tokenizer).decode_sequence_inplace(seq, SamplingParams()) == 0
    assert seq.output_text == ""


# ----------------------------------------------------------------------------------------------- byte-level BPE
def test_bpe_multibyte_text_round_trips_without_partial_characters(bpe_tokenizer):
    for text in MULTIBYTE_LINES + ["日本語😀✓", "a😀b", " ça → ∑"]:
        ids = bpe_tokenizer.encode(text, add_special_tokens=False)
        # Some character is split over several tokens, or this test would not test much.
        pieces = [bpe_tokenizer.decode([i]) for i in ids]
        assert any(REPLACEMENT in piece for piece in pieces) or len(text) < 12
        assert _decode_token_by_token(bpe_tokenizer, ids, True) == text
        assert _decode_token_by_token(bpe_tokenizer, [0] + ids + [4, 2], False) == bpe_tokenizer.decode(
            [0] + ids + [4, 2])


def test_bpe_emits_whole_characters_only(bpe_tokenizer):
    text = "日本語 😀"
    ids = bpe_tokenizer.encode(text, add_special_tokens=False)
    detokenizer, seq = Detokenizer(bpe_tokenizer), _make_seq()
    emitted = []
    for token_id in ids:
        seq.append_token_id(token_id, {token_id: 0.0})
        count = detokenizer.decode_sequence_inplace(seq, SamplingParams())
        emitted.append(seq.output_text[len(seq.output_text) - count:])
    assert "".join(emitted) == text
    assert all(REPLACEMENT not in piece for piece in emitted)
    assert emitted.count("") >= 1  # at least one step waited for the rest of a character


@pytest.mark.parametrize("skip_special_tokens", [True, False])
def test_bpe_random_sequences_match_decode(bpe_tokenizer, skip_special_tokens):
    rng = random.Random(2)
    vocab_size = len(bpe_tokenizer)
    exact = 0
    for _ in range(200):
        ids = _random_ids(rng, vocab_size, max_len=30)
        expected = bpe_tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)
        got = _decode_token_by_token(bpe_tokenizer, ids, skip_special_tokens)
        if expected.endswith(REPLACEMENT):
            # Text ending in an incomplete character is held back: what came out is a prefix of the full text.
            assert expected.startswith(got), ids
        else:
            assert got == expected, ids
            exact += 1
    assert exact > 100


# ----------------------------------------------------------------------------------------------- get_tokenizer
def test_get_tokenizer_loads_a_local_directory(bpe_tokenizer, tmp_path):
    bpe_tokenizer.save_pretrained(tmp_path)
    loaded = get_tokenizer(str(tmp_path))
    text = MULTIBYTE_LINES[0]
    assert loaded.encode(text, add_special_tokens=False) == bpe_tokenizer.encode(text, add_special_tokens=False)
    ids = loaded.encode(text, add_special_tokens=False)
    assert _decode_token_by_token(loaded, ids, True) == text
    assert loaded.decode(ids, skip_special_tokens=True) == text


def test_get_tokenizer_missing_directory(tmp_path):
    with pytest.raises(FileNotFoundError):
        get_tokenizer(str(tmp_path / "nope"))
