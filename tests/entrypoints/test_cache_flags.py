"""--enable-prefix-caching / --enable-encoder-cache (and their --no- forms) and --async-scheduling on every command that
builds an engine: the caches on and asynchronous scheduling off by default, and carried to the engine each path builds
(here, --live, --ray replicas, the server)."""
import argparse

import pytest
from hf_reference import build_tiny_model

from seq2seq_engine.engine.llm_engine import LLMEngine
from seq2seq_engine.entrypoints import text_cli, transcribe_cli
from seq2seq_engine.entrypoints.cli import build_parser
from seq2seq_engine.entrypoints.llm import LLM
from seq2seq_engine.entrypoints.openai import serve_cli

OFF = ["--no-enable-prefix-caching", "--no-enable-encoder-cache"]
COMMANDS = [(["generate", "--model", "m", "--input", "x.jsonl"], text_cli),
            (["summarize", "--model", "m", "--input", "x.jsonl"], text_cli),
            (["translate", "--model", "m", "--input", "x.jsonl"], text_cli),
            (["transcribe", "a.wav", "--model", "m"], transcribe_cli),
            (["transcribe", "-", "--model", "m", "--live"], transcribe_cli),
            (["serve", "m"], serve_cli)]


def _switches(kwargs):
    return kwargs["enable_prefix_caching"], kwargs["enable_encoder_cache"]


@pytest.mark.parametrize("argv, module", COMMANDS)
def test_cache_flags_on_every_command(argv, module):
    parser = build_parser()
    assert _switches(module.engine_kwargs(parser.parse_args(argv))) == (True, True)
    assert _switches(module.engine_kwargs(parser.parse_args(argv + OFF))) == (False, False)
    assert _switches(module.engine_kwargs(parser.parse_args(argv + ["--no-enable-prefix-caching"]))) == (False, True)
    assert _switches(module.engine_kwargs(parser.parse_args(argv + ["--no-enable-encoder-cache"]))) == (True, False)
    assert _switches(module.engine_kwargs(parser.parse_args(
        argv + OFF + ["--enable-prefix-caching", "--enable-encoder-cache"]))) == (True, True)  # the last one wins
    assert module.engine_kwargs(parser.parse_args(argv))["async_scheduling"] is False
    assert module.engine_kwargs(parser.parse_args(argv + ["--async-scheduling"]))["async_scheduling"] is True


class _Built(Exception):
    """Raised by the recorders below once they hold what the command would build its engine from."""


@pytest.fixture
def recorded(monkeypatch):
    """The engine keyword arguments each path hands on: to LLM (local, --live), to the replicas' ReplicaConfig
    (--ray) or to EngineArgs (serve); each recorder stops the command there."""
    seen = []

    def record(kwargs):
        seen.append(dict(kwargs))
        raise _Built()

    def fake_run_rows(job, rows, batch_class, config):
        record(config.engine_kwargs)
        yield from ()

    monkeypatch.setattr("seq2seq_engine.entrypoints.llm.LLM", lambda model, **kwargs: record(kwargs))
    monkeypatch.setattr("seq2seq_engine.model_loader.resolver.resolve_model_path", lambda model: model)
    monkeypatch.setattr("seq2seq_engine.integrations.ray_jobs.import_ray", lambda: argparse.Namespace())
    monkeypatch.setattr("seq2seq_engine.integrations.ray_jobs.run_rows", fake_run_rows)
    monkeypatch.setattr(LLMEngine, "from_engine_args", lambda engine_args: record(vars(engine_args)))
    return seen


def _run(argv, tmp_path):
    args = build_parser().parse_args(argv)
    with pytest.raises(_Built), open(tmp_path / "out.jsonl", "w") as out:
        if args.command == "serve":
            serve_cli.run(args)
        elif args.command == "transcribe":
            transcribe_cli.run(args, out)
        else:
            text_cli.run(args, out)


@pytest.mark.parametrize("argv", [["generate", "--input", "{dir}/prompts.txt"],
                                  ["translate", "--input", "{dir}/prompts.txt", "--ray"],
                                  ["summarize", "--input", "{dir}/prompts.txt", "--ray", "auto"],
                                  ["transcribe", "{dir}/a.wav"],
                                  ["transcribe", "{dir}/a.wav", "--ray"],
                                  ["transcribe", "-", "--live"],
                                  ["serve"]],
                         ids=["generate", "translate-ray", "summarize-ray", "transcribe", "transcribe-ray", "live",
                              "serve"])
def test_every_path_builds_its_engine_with_the_switches(argv, recorded, tmp_path):
    (tmp_path / "prompts.txt").write_text("hello\n")
    (tmp_path / "a.wav").write_bytes(b"")
    argv = [part.format(dir=tmp_path) for part in argv]
    model = ["m"] if argv[0] == "serve" else ["--model", "m"]
    _run(argv + model, tmp_path)
    _run(argv + model + OFF, tmp_path)
    _run(argv + model + ["--no-enable-encoder-cache"], tmp_path)
    _run(argv + model + ["--async-scheduling"], tmp_path)
    assert [_switches(kwargs) for kwargs in recorded] == [(True, True), (False, False), (True, False), (True, True)]
    assert [kwargs["async_scheduling"] for kwargs in recorded] == [False, False, False, True]


def test_switched_off_caches_are_absent_from_the_engine(tmp_path):
    model_dir, _ = build_tiny_model("llama", tmp_path)
    argv = ["generate", "--model", model_dir, "--input", "x.txt", "--skip-tokenizer-init",
            "--kv-cache-space-gb", "0.01"]
    for flags, present in (([], True), (OFF, False)):
        kwargs = text_cli.engine_kwargs(build_parser().parse_args(argv + flags))
        manager = LLM(model_dir, **kwargs).llm_engine.scheduler.block_manager
        assert (manager.prefix_cache is not None, manager.cross_cache is not None) == (present, present)
