"""What importing the package, LLM and the command line pulls in, each in a fresh interpreter: nothing a CPU run does
not use (xformers and torch._dynamo run only with the CUDA backend; transformers only once a config or tokenizer is
read; the server, Ray and the audio decoders only when used)."""
import json
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
