"""`seq2seq-engine generate|summarize|translate` on tiny random BART/Llama models: JSON lines in input order, equal
to HF `generate()` under the model's generation_config.json, per-line errors, and the in-order streaming driver."""
import dataclasses
import json
import os
import subprocess
import sys

import pytest
import torch
import transformers
from hf_reference import build_tiny_bart_with_tokenizer, build_tiny_model

from seq2seq_engine.engine.streaming import StreamError, stream_in_order
from seq2seq_engine.entrypoints.cli import main
from seq2seq_engine.entrypoints.text_cli import translation_prompts


def _records(path):
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def _hf_generated(hf_model, model_dir, text):
    """HF generate() under the saved generation config; the tokens after decoder_start and the forced BOS."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    with torch.no_grad():
        sequences = hf_model.generate(torch.tensor([tokenizer(text).input_ids]))
    tokens = sequences[0, 2:].tolist()
    return tokens[:tokens.index(2) + 1] if 2 in tokens else tokens


@pytest.mark.parametrize("command", ["generate", "summarize", "translate"])
def test_commands_stream_hf_identical_records_in_input_order(command, tmp_path, spm_bart_tokenizer):
    beams = {"num_beams": 2, "early_stopping": True} if command == "summarize" else {}
    model_dir, hf_model = build_tiny_bart_with_tokenizer(tmp_path, spm_bart_tokenizer, max_length=10, **beams)
    prompts = ["the quick brown fox", "hello world", "a lazy dog jumps over the fox", "fox", "world hello dog"]
    (tmp_path / "in.txt").write_text("\n".join(prompts) + "\n\n", encoding="utf-8")
    out_path = tmp_path / "out.jsonl"
    code = main([command, "--model", model_dir, "--input", str(tmp_path / "in.txt"), "--output", str(out_path),
                 "--max-in-flight", "2", "--quiet", "--kv-cache-space-gb", "0.05"])
    assert code == 0
    records = _records(out_path)
    assert [r["index"] for r in records] == list(range(len(prompts)))
    assert [r["prompt"] for r in records] == prompts
    for prompt, record in zip(prompts, records):
        assert record["token_ids"] == _hf_generated(hf_model, model_dir, prompt)
        assert ("alternatives" in record) == (command == "summarize")


def test_flags_override_the_generation_config(tmp_path, spm_bart_tokenizer):
    model_dir, hf_model = build_tiny_bart_with_tokenizer(tmp_path, spm_bart_tokenizer, max_length=10, num_beams=2)
    (tmp_path / "in.txt").write_text("the quick brown fox\nhello world\n", encoding="utf-8")
    out_path = tmp_path / "out.jsonl"
    code = main(["generate", "--model", model_dir, "--input", str(tmp_path / "in.txt"), "--output", str(out_path),
                 "--beam-width", "1", "--max-tokens", "3", "--quiet", "--kv-cache-space-gb", "0.05"])
    assert code == 0
    for record in _records(out_path):
        assert len(record["token_ids"]) <= 3 and "alternatives" not in record


def test_a_refused_line_gets_an_error_record_at_its_place(tmp_path, capsys):
    model_dir, _ = build_tiny_model("llama", tmp_path, vocab_size=32)
    lines = [{"prompt_token_ids": [5, 6, 7]}, {"prompt_token_ids": [5, 999]}, {"prompt_token_ids": [9, 4]}]
    (tmp_path / "in.jsonl").write_text("\n".join(json.dumps(line) for line in lines), encoding="utf-8")
    out_path = tmp_path / "out.jsonl"
    code = main(["generate", "--model", model_dir, "--input", str(tmp_path / "in.jsonl"), "--output",
                 str(out_path), "--max-tokens", "4", "--skip-tokenizer-init", "--quiet", "--kv-cache-space-gb",
                 "0.02"])
    assert code == 1
    records = _records(out_path)
    assert [r["index"] for r in records] == [0, 1, 2]
    assert "error" in records[1] and "999" in records[1]["error"]
    assert len(records[0]["token_ids"]) == 4 and len(records[2]["token_ids"]) == 4
    assert "1 refused" in capsys.readouterr().err


def test_bad_input_file_is_a_clear_error(tmp_path, capsys):
    (tmp_path / "bad.jsonl").write_text('{"prompt": "x"}\nnot json\n', encoding="utf-8")
    code = main(["generate", "--model", str(tmp_path / "nomodel"), "--input", str(tmp_path / "bad.jsonl")])
    assert code == 2
    assert "bad.jsonl:2: not valid JSON" in capsys.readouterr().err


class _Tokenizer:
    unk_token_id = 3
    src_lang = "en_XX"

    def convert_tokens_to_ids(self, token):
        return {"de_DE": 250003, "fr_XX": 250008}.get(token, self.unk_token_id)


def test_translation_prompts_set_the_source_language_and_start_the_decoder_with_the_target():
    tokenizer = _Tokenizer()
    args = type("Args", (), {"src_lang": "fr_XX", "tgt_lang": "de_DE"})()
    prompts = list(translation_prompts(["bonjour", {"prompt": "salut"}], tokenizer, args))
    assert tokenizer.src_lang == "fr_XX"
    assert prompts[0] == {"encoder_prompt": "bonjour", "decoder_prompt": {"prompt_token_ids": [250003]}}
    assert prompts[1]["encoder_prompt"] == {"prompt": "salut"}
    with pytest.raises(ValueError, match=r"tgt_lang \(--tgt-lang\) 'xx_YY' is not a language code"):
        list(translation_prompts(["x"], tokenizer, type("Args", (), {"src_lang": None, "tgt_lang": "xx_YY"})()))


@dataclasses.dataclass
class _Output:
    request_id: str
    finished: bool


class _OneAStepEngine:
    """Finishes one queued request per step: the newest (so outputs come back out of order) or the oldest."""

    def __init__(self, newest_first=True):
        self.newest_first = newest_first
        self.queued, self.aborted, self.max_seen = [], [], 0

    def add_request(self, request_id, prompt, params):
        if prompt == "bad":
            raise ValueError("bad prompt")
        self.queued.append(request_id)
        self.max_seen = max(self.max_seen, len(self.queued))

    def step(self, finished_only=False):
        if not self.queued:
            return []
        return [_Output(self.queued.pop(-1 if self.newest_first else 0), True)]

    def abort_request(self, request_ids):
        self.aborted.extend(request_ids)


def test_stream_in_order_reorders_bounds_the_queue_and_reports_refusals():
    engine = _OneAStepEngine()
    prompts = ["a", "b", "bad", "c", "d", "e"]
    items = list(stream_in_order(engine, ((p, None) for p in prompts), max_in_flight=3))
    assert [index for index, _ in items] == list(range(len(prompts)))
    assert isinstance(items[2][1], StreamError) and items[2][1].error == "bad prompt"
    assert [item.request_id.rsplit("-", 1)[1] for _, item in items if not isinstance(item, StreamError)] == \
        ["0", "1", "3", "4", "5"]
    assert engine.max_seen <= 3


def test_stream_in_order_aborts_what_is_left_when_the_consumer_stops():
    engine = _OneAStepEngine(newest_first=False)
    stream = stream_in_order(engine, ((p, None) for p in "abcdef"), max_in_flight=4)
    next(stream)
    stream.close()
    assert engine.aborted and set(engine.aborted) == set(engine.queued)


def test_console_script_is_installed_and_answers_help():
    bin_dir = os.path.dirname(sys.executable)
    for command in ("generate", "summarize", "translate"):
        result = subprocess.run([os.path.join(bin_dir, "seq2seq-engine"), command, "--help"],
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == 0 and "--model" in result.stdout
