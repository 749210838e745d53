"""The package's Whisper tokenizer (`tokenizers` only) against transformers' on the bundled real tokenizers and on
one transformers saved: encode, decode (prompts, timestamps, special tokens), conversions, vocabulary and ids."""
import json
import random
import shutil

import pytest
from transformers import AutoTokenizer

from seq2seq_engine.model_loader.resolver import resolve_model_path
from seq2seq_engine.tokenization.tokenizer import get_tokenizer
from seq2seq_engine.tokenization.whisper_tokenizer import WhisperJsonTokenizer, load_whisper_tokenizer

TEXTS = ["Hello world.", " And so, my fellow Americans: ask not", "1, 2, 3, 4.5% -- $7", "  two spaces\nline\ttab",
         "Grüße aus Köln — ça va? 日本語のテキスト 🎉", "<|en|> a special token typed as text", "don't I'm", ""]


@pytest.fixture(scope="module", params=["whisper-tiny.en", "whisper-base", "saved by transformers"])
def tokenizers(request, tmp_path_factory):
    model_dir = resolve_model_path("whisper-base" if request.param == "saved by transformers" else request.param)
    if request.param == "saved by transformers":
        saved = tmp_path_factory.mktemp("saved")
        AutoTokenizer.from_pretrained(model_dir, local_files_only=True).save_pretrained(saved)
        model_dir = str(saved)
    ours = get_tokenizer(model_dir)
    assert isinstance(ours, WhisperJsonTokenizer)
    return AutoTokenizer.from_pretrained(model_dir, local_files_only=True), ours


def test_vocabulary_and_special_tokens_match(tokenizers):
    hf, ours = tokenizers
    assert len(ours) == len(hf)
    assert ours.get_vocab() == hf.get_vocab()
    assert ours.get_added_vocab() == hf.get_added_vocab()
    assert ours.all_special_ids == hf.all_special_ids and ours.all_special_tokens == hf.all_special_tokens
    assert (ours.eos_token_id, ours.bos_token_id, ours.pad_token_id, ours.unk_token_id) == (
        hf.eos_token_id, hf.bos_token_id, hf.pad_token_id, hf.unk_token_id)
    for token in ("<|en|>", "<|0.00|>", "<|30.00|>", "Hello", "not a token at all"):
        assert ours.convert_tokens_to_ids(token) == hf.convert_tokens_to_ids(token), token


@pytest.mark.parametrize("add_special_tokens", [True, False])
def test_encode_matches(tokenizers, add_special_tokens):
    hf, ours = tokenizers
    for text in TEXTS:
        assert ours.encode(text, add_special_tokens=add_special_tokens) == hf.encode(
            text, add_special_tokens=add_special_tokens), text


def test_decode_and_conversions_match_on_random_ids(tokenizers):
    """Random ids over the whole vocabulary (text, languages, tasks, timestamps), some behind a previous-text
    prompt, decoded with and without special tokens."""
    hf, ours = tokenizers
    rng, size = random.Random(0), len(hf)
    prompt, start = hf.convert_tokens_to_ids("<|startofprev|>"), hf.convert_tokens_to_ids("<|startoftranscript|>")
    for trial in range(400):
        ids = [rng.randrange(size if rng.random() < 0.3 else hf.eos_token_id) for _ in range(rng.randint(0, 24))]
        if trial % 4 == 0:
            ids = [prompt, *ids, *([start] if trial % 8 == 0 else []), *ids[:4]]
        for skip in (False, True):
            assert ours.decode(ids, skip_special_tokens=skip) == hf.decode(ids, skip_special_tokens=skip), ids
            assert ours.convert_ids_to_tokens(ids, skip_special_tokens=skip) == hf.convert_ids_to_tokens(
                ids, skip_special_tokens=skip)
        tokens = hf.convert_ids_to_tokens(ids)
        assert ours.convert_tokens_to_string(tokens) == hf.convert_tokens_to_string(tokens)
        assert ours.convert_tokens_to_ids(tokens) == hf.convert_tokens_to_ids(tokens)


@pytest.mark.parametrize("setting", [{"clean_up_tokenization_spaces": True}, {"language": "de"},
                                     {"task": "translate"}, {"predict_timestamps": True},
                                     {"tokenizer_class": "GPT2Tokenizer"}])
def test_settings_it_does_not_follow_leave_the_directory_to_transformers(tmp_path, setting):
    model_dir = resolve_model_path("whisper-tiny.en")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(f"{model_dir}/{name}", tmp_path / name)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({**config, **setting}))
    assert load_whisper_tokenizer(str(tmp_path)) is None
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    assert isinstance(load_whisper_tokenizer(str(tmp_path)), WhisperJsonTokenizer)
    (tmp_path / "tokenizer.json").unlink()
    assert load_whisper_tokenizer(str(tmp_path)) is None
