"""What importing the package, LLM and the command line pulls in, each in a fresh interpreter: nothing a CPU run does
not use (xformers and torch._dynamo run only with the CUDA backend; transformers only once a config or tokenizer is
read; the server, Ray and the audio decoders only when used)."""
import json
import os
import subprocess
import sys

import pytest

NOT_ON_IMPORT = ("xformers", "torch._dynamo", "transformers", "tokenizers", "fastapi", "uvicorn", "starlette",
                 "prometheus_client", "ray", "av", "soundfile", "soxr", "silero_vad", "sympy")


def _loaded_after(statement: str) -> set:
    code = f"import json, sys; {statement}; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    return set(json.loads(out.splitlines()[-1]))


@pytest.mark.parametrize("statement", ["import seq2seq_engine", "from seq2seq_engine import LLM",
                                       "from seq2seq_engine.entrypoints import cli"])
def test_import_pulls_in_nothing_a_cpu_run_does_not_use(statement):
    loaded = _loaded_after(statement)
    unexpected = sorted(name for name in loaded for package in NOT_ON_IMPORT
                        if name == package or name.startswith(package + "."))
    assert not unexpected, f"`{statement}` imported {unexpected}"


def test_llm_import_stays_below_the_engine():
    loaded = _loaded_after("from seq2seq_engine import LLM")
    assert "seq2seq_engine.engine.llm_engine" in loaded
    assert "seq2seq_engine.attention.backends.torch_backend" in loaded
    assert not any(name.startswith("seq2seq_engine.transcription") for name in loaded)


def test_cli_transcription_of_a_ct2_directory_imports_no_transformers(tmp_path):
    """A CTranslate2 Whisper directory is converted (into an empty cache), configured, tokenized and transcribed
    (word timestamps, srt) by the command line without transformers: the config from config.json, the tokenizer on
    `tokenizers`, the mel filters and language table held by the package."""
    from benchmarks.lib.clips import sample_dir
    from benchmarks.lib.whisper_engines import ct2_model_dir

    ct2_dir = ct2_model_dir("whisper-tiny.en")
    clip, modules = f"{sample_dir()}/en/counting.wav", tmp_path / "modules.json"
    code = ("import json, sys; from seq2seq_engine.entrypoints import cli; "
            f"status = cli.main(['transcribe', {clip!r}, '--model', {ct2_dir!r}, '--word-timestamps', "
            "'--output-format', 'srt', '--quiet']); "
            f"json.dump(sorted(sys.modules), open({str(modules)!r}, 'w')); sys.exit(status)")
    from seq2seq_engine.cache_dir import cache_root

    (tmp_path / "cache").mkdir()
    if os.path.isdir(os.path.join(cache_root(), "kernels")):   # the native kernels built already: not rebuilt
        (tmp_path / "cache" / "kernels").symlink_to(os.path.join(cache_root(), "kernels"))
    env = {**os.environ, "SEQ2SEQ_ENGINE_CACHE": str(tmp_path / "cache")}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "00:00:00,000 -->" in run.stdout and "nine, ten" in run.stdout.lower(), run.stdout   # the srt cues
    loaded = json.loads(modules.read_text())
    assert not [name for name in loaded if name == "transformers" or name.startswith("transformers.")]
    assert "seq2seq_engine.tokenization.whisper_tokenizer" in loaded


def test_console_script_imports_without_collections_and_freezes_the_imported_heap():
    """`seq2seq-engine` (entrypoints/console.py) imports torch and the engine with the collector off (no collection
    walks the half-built heap), leaves it on, and has moved the imported objects to the permanent generation."""
    code = ("import gc, json, sys; runs = []; gc.callbacks.append(lambda phase, info: runs.append(info)); "
            "from seq2seq_engine.entrypoints import console; runs.clear(); cli = console.import_command_line(); "
            "print(json.dumps([len(runs), gc.isenabled(), gc.get_freeze_count(), 'torch' in sys.modules, "
            "callable(cli.main)]))")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    collections, enabled, frozen, torch_loaded, has_main = json.loads(out.splitlines()[-1])
    assert torch_loaded and has_main and enabled and collections == 0
    assert frozen > 100_000, frozen
