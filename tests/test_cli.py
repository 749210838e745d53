"""The `seq2seq-engine generate` command on a tiny random BART with a tokenizer."""
import json
import os
import subprocess
import sys

import torch
import transformers

from hf_reference import build_tiny_model, hf_greedy
from seq2seq_engine.entrypoints.cli import main


def test_generate_writes_one_jsonl_record_per_prompt_in_order(tmp_path, spm_bart_tokenizer):
    model_dir, hf_model = build_tiny_model("bart", tmp_path, vocab_size=len(spm_bart_tokenizer))
    spm_bart_tokenizer.save_pretrained(model_dir)
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    prompts = ["the quick brown fox", "hello world", "a lazy dog jumps over the fox"]
    (tmp_path / "in.txt").write_text("\n".join(prompts) + "\n\n", encoding="utf-8")
    out_path = tmp_path / "out.jsonl"
    code = main(["generate", "--model", model_dir, "--input", str(tmp_path / "in.txt"), "--output",
                 str(out_path), "--max-tokens", "6", "--batch-size", "2", "--quiet", "--kv-cache-space-gb", "0.05"])
    assert code == 0
    records = [json.loads(line) for line in out_path.read_text(encoding="utf-8").splitlines()]
    assert [r["prompt"] for r in records] == prompts
    for prompt, record in zip(prompts, records):
        expected, _ = hf_greedy(hf_model, torch.tensor(tokenizer(prompt).input_ids), [2, 0], 6)
        assert record["token_ids"] == expected[:len(record["token_ids"])]
        assert record["finish_reason"] in ("stop", "length")


def test_bad_input_file_is_a_clear_error(tmp_path, capsys):
    (tmp_path / "bad.jsonl").write_text('{"prompt": "x"}\nnot json\n', encoding="utf-8")
    code = main(["generate", "--model", str(tmp_path / "nomodel"), "--input", str(tmp_path / "bad.jsonl")])
    assert code == 2
    assert "error" in capsys.readouterr().err


def test_console_script_is_installed_and_answers_help():
    bin_dir = os.path.dirname(sys.executable)
    result = subprocess.run([os.path.join(bin_dir, "seq2seq-engine"), "generate", "--help"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and "--model" in result.stdout
