"""`seq2seq-engine translate --tgt-lang` end to end on tiny random M2M100 and Marian models with offline
sentencepiece tokenizers: records equal to HF `generate()` given the language the family's way (M2M100: source
code from the tokenizer, target code as forced BOS; Marian: `>>xx<<` before the source), and clear errors."""
import json
import re

import pytest
import torch
from mt_reference import m2m100_tokenizer, marian_tokenizer, save_model

from seq2seq_engine import LLM
from seq2seq_engine.entrypoints.cli import main

TEXTS = ["the quick brown fox", "hello world", "a lazy dog jumps over the fox"]
MAX_TOKENS = 7


def _translate(tmp_path, model_dir, *flags):
    (tmp_path / "in.txt").write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    out_path = tmp_path / "out.jsonl"
    code = main(["translate", "--model", model_dir, "--input", str(tmp_path / "in.txt"), "--output", str(out_path),
                 "--max-tokens", str(MAX_TOKENS), "--quiet", "--kv-cache-space-gb", "0.05", *flags])
    records = [json.loads(line) for line in out_path.read_text(encoding="utf-8").splitlines()] if code == 0 else []
    return code, records


def _until_eos(tokens, eos=2):
    return tokens[:tokens.index(eos) + 1] if eos in tokens else tokens


@pytest.fixture(scope="module")
def m2m100_dir(tmp_path_factory, spm_model_file):
    folder = tmp_path_factory.mktemp("m2m100")
    tokenizer = m2m100_tokenizer(spm_model_file, str(folder / "tokenizer"))
    return save_model("m2m100", str(folder / "model"), tokenizer=tokenizer) + (tokenizer,)


@pytest.fixture(scope="module")
def marian_dir(tmp_path_factory, spm_model_file):
    folder = tmp_path_factory.mktemp("marian")
    tokenizer = marian_tokenizer(spm_model_file, str(folder / "tokenizer"))
    return save_model("marian", str(folder / "model"), tokenizer=tokenizer) + (tokenizer,)


def test_m2m100_translate_matches_hf_forced_bos(tmp_path, m2m100_dir):
    model_dir, hf, tokenizer = m2m100_dir
    code, records = _translate(tmp_path, model_dir, "--src-lang", "fr", "--tgt-lang", "de")
    assert code == 0 and [r["prompt"] for r in records] == TEXTS
    tokenizer.src_lang, lang = "fr", tokenizer.get_lang_id("de")
    for text, record in zip(TEXTS, records):
        input_ids = tokenizer(text).input_ids
        assert input_ids[0] == tokenizer.get_lang_id("fr")
        with torch.no_grad():
            sequence = hf.generate(torch.tensor([input_ids]), forced_bos_token_id=lang,
                                   max_new_tokens=MAX_TOKENS + 1)[0].tolist()
        assert sequence[:2] == [2, lang]
        assert record["token_ids"] == _until_eos(sequence[2:])


def test_marian_translate_prefixes_the_target_token(tmp_path, marian_dir):
    model_dir, hf, tokenizer = marian_dir
    code, records = _translate(tmp_path, model_dir, "--tgt-lang", "de")
    assert code == 0
    for text, record in zip(TEXTS, records):
        input_ids = tokenizer(f">>de<< {text}").input_ids
        assert input_ids[0] == tokenizer.convert_tokens_to_ids(">>de<<") and input_ids[-1] == 2
        with torch.no_grad():
            sequence = hf.generate(torch.tensor([input_ids]), max_new_tokens=MAX_TOKENS)[0].tolist()
        assert sequence[0] == hf.config.decoder_start_token_id
        assert record["token_ids"] == _until_eos(sequence[1:])
        assert record["prompt"] == f">>de<< {text}"


@pytest.mark.parametrize("flags,message", [
    (["--tgt-lang", "es"], r"tgt_lang \(--tgt-lang\) 'es' is not a language code .*valid codes include: fr, de"),
    (["--src-lang", "en"], r"src_lang \(--src-lang\) does not apply to Marian models"),
])
def test_marian_language_errors(tmp_path, marian_dir, capsys, flags, message):
    code, _ = _translate(tmp_path, marian_dir[0], *flags)
    assert code == 2
    assert re.search(message, capsys.readouterr().err)


def test_m2m100_unknown_code_lists_valid_ones(tmp_path, m2m100_dir, capsys):
    code, _ = _translate(tmp_path, m2m100_dir[0], "--tgt-lang", "xx")
    assert code == 2
    assert "tgt_lang (--tgt-lang) 'xx' is not a language code of this tokenizer; valid codes include: af, am" \
        in capsys.readouterr().err


def test_llm_translation_prompts_match_the_cli(m2m100_dir):
    model_dir, _, tokenizer = m2m100_dir
    llm = LLM(model_dir, dtype="float32", kv_cache_space_gb=0.05)
    prompts = llm.translation_prompts(TEXTS[:2], src_lang="fr", tgt_lang="de")
    assert prompts == [{"encoder_prompt": text, "decoder_prompt": {"prompt_token_ids": [tokenizer.get_lang_id("de")]}}
                       for text in TEXTS[:2]]
    assert llm.get_tokenizer().src_lang == "fr"
    output = llm.generate(prompts[0], {"temperature": 0.0, "max_tokens": 3}, use_tqdm=False)[0]
    assert output.prompt_token_ids == [2, tokenizer.get_lang_id("de")]
    assert output.encoder_prompt_token_ids[0] == tokenizer.get_lang_id("fr")
