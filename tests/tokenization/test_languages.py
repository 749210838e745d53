"""Translation languages per family (tokenization/languages.py) on real transformers tokenizers built offline over
a tiny sentencepiece model: mBART and NLLB codes are tokens, M2M100 maps `fr` to `__fr__`, Marian prefixes
`>>xx<<`, Pegasus refuses; every prompt form gets the languages, and bad codes are clear errors."""
import pytest
import transformers
from mt_reference import m2m100_tokenizer, marian_tokenizer

from seq2seq_engine.tokenization.languages import TranslationLanguages, translation_languages


@pytest.fixture(scope="module")
def nllb(spm_model_file):
    return transformers.NllbTokenizer(vocab_file=spm_model_file, src_lang="eng_Latn")


@pytest.fixture(scope="module")
def mbart(spm_model_file):
    return transformers.MBartTokenizer(vocab_file=spm_model_file, src_lang="en_XX")


def test_nllb_codes_are_tokens(nllb):
    languages = translation_languages(nllb, "fra_Latn", "deu_Latn", "m2m_100")
    assert nllb.src_lang == "fra_Latn" and nllb.encode("hello")[0] == nllb.convert_tokens_to_ids("fra_Latn")
    assert languages.decoder_prompt_ids == [nllb.convert_tokens_to_ids("deu_Latn")]
    with pytest.raises(ValueError, match=r"src_lang \(--src-lang\) 'fr' is not a language code of this tokenizer; "
                                         r"valid codes include: ace_Arab, ace_Latn"):
        translation_languages(nllb, "fr", None, "m2m_100")
    with pytest.raises(ValueError, match=r"src_lang \(--src-lang\) 'en_XX' is not a language code"):
        translation_languages(nllb, "en_XX", None)        # the family from the tokenizer class: NLLB


def test_mbart_codes_are_tokens(mbart):
    languages = translation_languages(mbart, None, "de_DE", "mbart")
    assert languages.decoder_prompt_ids == [mbart.convert_tokens_to_ids("de_DE")]
    with pytest.raises(ValueError, match=r"tgt_lang \(--tgt-lang\) 'de' is not a language code.*ar_AR, cs_CZ"):
        translation_languages(mbart, None, "de", "mbart")


def test_m2m100_codes_map_to_their_tokens(tmp_path, spm_model_file):
    tokenizer = m2m100_tokenizer(spm_model_file, str(tmp_path))
    languages = translation_languages(tokenizer, "de", "fr", "m2m_100")
    assert tokenizer.src_lang == "de"
    assert languages.decoder_prompt_ids == [tokenizer.convert_tokens_to_ids("__fr__")]
    with pytest.raises(ValueError, match=r"'__fr__' is not a language code.*valid codes include: af, am, ar"):
        translation_languages(tokenizer, None, "__fr__", "m2m_100")


def test_marian_prefixes_every_prompt_form(tmp_path, spm_model_file):
    tokenizer = marian_tokenizer(spm_model_file, str(tmp_path))
    fr = tokenizer.convert_tokens_to_ids(">>fr<<")
    for code in ("fr", ">>fr<<"):
        languages = translation_languages(tokenizer, None, code, "marian")
        assert languages == TranslationLanguages(encoder_prefix_text=">>fr<<", encoder_prefix_id=fr)
    assert languages.prompt("hi") == ">>fr<< hi"
    assert languages.prompt({"prompt": "hi", "mm": 1}) == {"prompt": ">>fr<< hi", "mm": 1}
    assert languages.prompt({"prompt_token_ids": [7, 8]}) == {"prompt_token_ids": [fr, 7, 8]}
    explicit = {"encoder_prompt": "hi", "decoder_prompt": {"prompt_token_ids": [5]}}
    assert languages.prompt(explicit) == {"encoder_prompt": ">>fr<< hi", "decoder_prompt": {"prompt_token_ids": [5]}}
    with pytest.raises(TypeError, match="cannot put the target language token before a prompt of type int"):
        languages.prompt(3)
    # the class name tells the family when the model type is not given
    assert translation_languages(tokenizer, None, "de").encoder_prefix_id == tokenizer.convert_tokens_to_ids(">>de<<")


def test_single_target_marian_says_so(spm_model_file):
    tokenizer = transformers.MarianTokenizer(spm_model_file, spm_model_file, _vocab_without_codes(spm_model_file),
                                             unk_token="<unk>", eos_token="</s>", pad_token="<pad>")
    with pytest.raises(ValueError, match=r"'fr' .*this Marian model has no >>fr<< token: it translates into one "
                                         r"fixed language"):
        translation_languages(tokenizer, None, "fr", "marian")


def _vocab_without_codes(spm_model_file):
    import json
    import os

    import sentencepiece
    processor = sentencepiece.SentencePieceProcessor(model_file=spm_model_file)
    path = os.path.join(os.path.dirname(spm_model_file), "vocab_plain.json")
    with open(path, "w", encoding="utf-8") as handle:
        json.dump({processor.id_to_piece(i): i for i in range(processor.get_piece_size())}, handle)
    return path


def test_pegasus_and_missing_tokenizer_are_refused(mbart):
    with pytest.raises(ValueError, match="Pegasus models summarize"):
        translation_languages(mbart, None, "de_DE", "pegasus")
    with pytest.raises(ValueError, match="need a tokenizer"):
        translation_languages(None, None, "de_DE", "m2m_100")
    assert translation_languages(None).prompt("x") == "x"        # no languages: prompts unchanged


def test_other_tokenizers_take_any_vocabulary_token(spm_tokenizer):
    """A tokenizer of no multilingual family (BART-style): the target is any token of its vocabulary."""
    languages = translation_languages(spm_tokenizer, None, "<s>", "bart")
    assert languages.decoder_prompt_ids == [spm_tokenizer.convert_tokens_to_ids("<s>")] == [0]
    with pytest.raises(ValueError, match=r"'zz_ZZ' is not a language code .*the tokenizer lists no language codes"):
        translation_languages(spm_tokenizer, None, "zz_ZZ", "bart")


def test_without_target_prompts_are_unchanged(mbart):
    languages = translation_languages(mbart, "fr_XX", None, "mbart")
    assert mbart.src_lang == "fr_XX"
    assert list(languages.prompts(["a", {"prompt_token_ids": [4]}])) == ["a", {"prompt_token_ids": [4]}]
