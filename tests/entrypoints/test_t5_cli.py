"""`seq2seq-engine summarize|translate` on a tiny random T5 directory with a tokenizer: --prefix puts the task text
before every text prompt, and the records equal HF greedy decoding of the prefixed text."""
import json

import pytest
import torch
import transformers
from hf_reference import hf_greedy
from t5_reference import build_tiny_t5

from seq2seq_engine.entrypoints.cli import main
from seq2seq_engine.entrypoints.task_prefix import with_prefix


@pytest.mark.parametrize("command,prefix", [("translate", "translate English to German: "),
                                            ("summarize", None)])
def test_text_commands_run_a_t5_directory(command, prefix, tmp_path, spm_bart_tokenizer):
    model_dir, hf_model = build_tiny_t5("t5-v1.1", tmp_path, vocab_size=len(spm_bart_tokenizer))
    spm_bart_tokenizer.save_pretrained(model_dir)
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    lines = ["the quick brown fox", "hello world", "a lazy dog"]
    (tmp_path / "in.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    out_path = tmp_path / "out.jsonl"
    flags = ["--prefix", prefix] if prefix else []
    code = main([command, "--model", model_dir, "--input", str(tmp_path / "in.txt"), "--output", str(out_path),
                 "--max-tokens", "6", "--temperature", "0", "--quiet", "--kv-cache-space-gb", "0.05", *flags])
    assert code == 0
    records = [json.loads(line) for line in out_path.read_text(encoding="utf-8").splitlines()]
    for line, record in zip(lines, records):
        text = (prefix or "") + line
        assert record["prompt"] == text
        expected, _ = hf_greedy(hf_model, torch.tensor(tokenizer(text).input_ids), [0], 6)
        stop = expected.index(2) + 1 if 2 in expected else len(expected)
        assert record["token_ids"] == expected[:stop]


def test_prefix_applies_to_text_prompts_only():
    args = type("Args", (), {"prefix": "summarize: "})()
    prompts = ["a", {"prompt": "b"}, {"prompt_token_ids": [5, 6]}, {"encoder_prompt": "c", "decoder_prompt": "d"},
               {"encoder_prompt": {"prompt_token_ids": [7]}}]
    assert with_prefix(prompts, args) == [
        "summarize: a", {"prompt": "summarize: b"}, {"prompt_token_ids": [5, 6]},
        {"encoder_prompt": "summarize: c", "decoder_prompt": "d"}, {"encoder_prompt": {"prompt_token_ids": [7]}}]
    assert with_prefix(prompts, type("Args", (), {"prefix": None})()) is prompts
