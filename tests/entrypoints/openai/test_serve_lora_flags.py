"""`seq2seq-engine serve`'s LoRA flags: --lora-modules in both forms, the start-up refusals (no --enable-lora, a name
given twice or equal to a served model's, an unknown base model, an adapter that cannot be served: exit 2 naming it),
and the runtime routes: 404 unless --allow-runtime-lora-updating or its environment variables turn them on."""
import argparse

import httpx
import pytest
from hf_reference import build_tiny_model
from server_utils import build_engine, running_models

from seq2seq_engine.entrypoints.openai import serve_cli
from seq2seq_engine.entrypoints.openai.lora_registry import (RUNTIME_UPDATING_ENV, LoRAModule, parse_lora_module,
                                                             runtime_updating_allowed)


def _args(argv):
    return serve_cli.configure_parser(argparse.ArgumentParser()).parse_args(argv)


def test_lora_modules_take_name_path_and_vllm_json():
    assert parse_lora_module("sql=/adapters/sql") == LoRAModule("sql", "/adapters/sql")
    assert parse_lora_module('{"name": "sql", "path": "/a", "base_model_name": "m"}') == LoRAModule("sql", "/a", "m")
    assert _args(["m", "--lora-modules", "x=/p", '{"name": "y", "path": "/q"}']).lora_modules == [
        LoRAModule("x", "/p"), LoRAModule("y", "/q")]
    for text, message in [("nopath", "write name=path"), ("=/p", "must not be empty"), ("{bad", "not valid JSON"),
                          ('{"name": "x"}', "string `name` and `path`"),
                          ('{"name": "x", "path": "/p", "r": 8}', "'r'")]:
        with pytest.raises(ValueError, match=message):
            parse_lora_module(text)


def test_a_malformed_lora_module_is_an_argparse_error(capsys):
    with pytest.raises(SystemExit) as exited:
        _args(["m", "--lora-modules", "nopath"])
    assert exited.value.code == 2 and "write name=path" in capsys.readouterr().err


@pytest.mark.parametrize("flags,message", [
    (["--lora-modules", "a=/x"], "--lora-modules needs --enable-lora"),
    (["--enable-lora", "--lora-modules", "a=/x", "a=/y"], "'a' is given twice"),
    (["--enable-lora", "--lora-modules", "m=/x"], "'m' is a served model's name"),
    (["--enable-lora", "--lora-modules", '{"name": "a", "path": "/x", "base_model_name": "nope"}'], "'nope'"),
])
def test_lora_modules_are_checked_before_any_model_is_loaded(flags, message, capsys):
    assert serve_cli.run(_args(["/no/such/model", "--served-model-name", "m"] + flags)) == serve_cli.EXIT_USAGE
    assert message in capsys.readouterr().err


@pytest.fixture(scope="module")
def llama(tmp_path_factory, spm_tokenizer):
    model_dir, _ = build_tiny_model("llama", tmp_path_factory.mktemp("serve_lora_flags"),
                                    vocab_size=len(spm_tokenizer))
    spm_tokenizer.save_pretrained(model_dir)
    return model_dir


def test_an_adapter_that_cannot_be_served_stops_the_start(llama, tmp_path, capsys):
    missing = str(tmp_path / "nothing")
    args = _args([llama, "--enable-lora", "--lora-modules", f"bad={missing}", "--kv-cache-space-gb", "0.05"])
    assert serve_cli.run(args) == serve_cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert "adapter 'bad'" in err and missing in err and "no such directory" in err


def test_runtime_updating_is_off_unless_asked(monkeypatch):
    for name in RUNTIME_UPDATING_ENV:
        monkeypatch.delenv(name, raising=False)
    assert not runtime_updating_allowed(False) and runtime_updating_allowed(True)
    for name in RUNTIME_UPDATING_ENV:
        monkeypatch.setenv(name, "True")
        assert runtime_updating_allowed(False)
        monkeypatch.setenv(name, "0")
        assert not runtime_updating_allowed(False)


def test_runtime_routes_are_404_without_the_flag(llama):
    with running_models({"llama": build_engine(llama, enable_lora=True)}) as server:
        for route, body in (("load_lora_adapter", {"lora_name": "a", "lora_path": "/x"}),
                            ("unload_lora_adapter", {"lora_name": "a"})):
            response = httpx.post(f"{server.url}/v1/{route}", json=body, timeout=30)
            assert response.status_code == 404, response.text
