"""`--lora PATH` on the text commands and on `transcribe` (files and --live): every request runs with the adapter (the
results are the engine's for that adapter, not the base model's), and an adapter that cannot be served is a usage
error (exit 2, one line naming it), never a traceback."""
import argparse
import io
import json
import os

import pytest
from conftest import require_model, require_speech_clips
from hf_reference import build_tiny_model
from lora.lora_reference import save_random_adapter, whisper_adapter

from seq2seq_engine import LLM, LoRARequest
from seq2seq_engine.entrypoints import transcribe_cli
from seq2seq_engine.entrypoints.cli import main
from seq2seq_engine.entrypoints.live_cli import run_live

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPTS = ["the quick brown fox", "hello world", "a lazy dog"]
GREEDY = ["--max-tokens", "6", "--temperature", "0", "--quiet", "--kv-cache-space-gb", "0.05"]


@pytest.fixture(scope="module")
def llama(tmp_path_factory, spm_tokenizer):
    root = tmp_path_factory.mktemp("lora_cli")
    model_dir, hf_model = build_tiny_model("llama", root, vocab_size=len(spm_tokenizer))
    spm_tokenizer.save_pretrained(model_dir)
    path, _ = save_random_adapter(hf_model, root / "adapter", 8, ["q_proj", "v_proj", "down_proj"], seed=42,
                                  b_scale=4.0)
    (root / "in.txt").write_text("\n".join(PROMPTS) + "\n", encoding="utf-8")
    return model_dir, path, str(root / "in.txt")


def test_generate_runs_every_prompt_with_the_adapter(llama, tmp_path):
    model_dir, path, prompts = llama
    out = tmp_path / "out.jsonl"
    assert main(["generate", "--model", model_dir, "--input", prompts, "--output", str(out), "--lora", path,
                 "--lora-name", "mine"] + GREEDY) == 0
    records = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    llm = LLM(model_dir, enable_lora=True, max_lora_rank=8, kv_cache_space_gb=0.05)
    params = {"max_tokens": 6, "temperature": 0.0}
    adapted = llm.generate(PROMPTS, params, use_tqdm=False, lora_request=LoRARequest("mine", 1, path))
    base = llm.generate(PROMPTS, params, use_tqdm=False)
    assert [r["token_ids"] for r in records] == [o.outputs[0].token_ids for o in adapted]
    assert [r["token_ids"] for r in records] != [o.outputs[0].token_ids for o in base]


@pytest.mark.parametrize("case", ["missing", "malformed", "name_alone"])
def test_a_bad_adapter_is_a_usage_error(llama, tmp_path, capsys, case):
    model_dir, _, prompts = llama
    (tmp_path / "malformed").mkdir()
    flags = {"missing": ["--lora", str(tmp_path / "nothing")], "malformed": ["--lora", str(tmp_path / "malformed")],
             "name_alone": ["--lora-name", "x"]}[case]
    message = {"missing": "no such directory", "malformed": "adapter_config.json is missing",
               "name_alone": "--lora-name needs --lora"}[case]
    code = main(["generate", "--model", model_dir, "--input", prompts, "--output", str(tmp_path / "o.jsonl")]
                + GREEDY + flags)
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err


@pytest.fixture(scope="module")
def whisper(tmp_path_factory):
    model_dir = require_model("whisper-tiny.en")
    return model_dir, whisper_adapter(model_dir, tmp_path_factory.mktemp("lora_cli_whisper") / "w")


def test_transcribe_runs_every_window_with_the_adapter(whisper, capsys, tmp_path):
    model_dir, path = whisper
    clip = os.path.join(require_speech_clips(), "en", "quick_brown_fox.wav")
    flags = ["--kv-cache-space-gb", "0.3", "--swap-space-gb", "0.01", "--quiet"]
    assert main(["transcribe", clip, "--model", model_dir, "--lora", path] + flags) == 0
    printed = capsys.readouterr().out
    llm = LLM(model_dir, enable_lora=True, kv_cache_space_gb=0.3, swap_space_gb=0.01)
    [adapted] = llm.transcribe(clip, use_tqdm=False, lora_request=LoRARequest("w", 1, path))
    [base] = llm.transcribe(clip, use_tqdm=False)
    assert printed == adapted.text + "\n" and adapted.text != base.text
    (tmp_path / "empty").mkdir()
    assert main(["transcribe", clip, "--model", model_dir, "--lora", str(tmp_path / "empty")] + flags) == 2
    err = capsys.readouterr().err
    assert "adapter_config.json is missing" in err and "Traceback" not in err


def test_live_transcription_runs_every_decode_with_the_adapter(whisper):
    model_dir, path = whisper
    with open(os.path.join(require_speech_clips(), "en", "quick_brown_fox.wav"), "rb") as handle:
        wav = handle.read()
    printed = []
    for flags in (["--lora", path], []):
        args = transcribe_cli.configure_parser(argparse.ArgumentParser()).parse_args(
            ["-", "--live", "--model", model_dir, "--kv-cache-space-gb", "0.3", "--swap-space-gb", "0.01"] + flags)
        out = io.StringIO()
        run_live(args, transcribe_cli.engine_kwargs(args), out, source=io.BytesIO(wav))
        printed.append(out.getvalue())
    assert printed[0].strip() and printed[1].strip() and printed[0] != printed[1]
