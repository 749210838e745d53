"""Fixtures shared by the transcription tests (registered in tests/conftest.py): the packaged whisper-tiny.en, an
engine on it with a small KV pool, and a spy on the tokens of each stitched window."""
import pytest
from conftest import require_model

from seq2seq_engine.transcription import job as job_module


@pytest.fixture(scope="module")
def tiny_dir():
    return require_model("whisper-tiny.en")


@pytest.fixture(scope="module")
def tiny_llm(tiny_dir):
    from seq2seq_engine import LLM
    return LLM(tiny_dir, kv_cache_space_gb=0.3, swap_space_gb=0.05)


@pytest.fixture()
def window_tokens(monkeypatch):
    """Per stitched input (in the order results are made), the token ids of each window it was stitched from."""
    calls = []
    real = job_module.stitch

    def spy(windows, *args, **kwargs):
        calls.append([list(w.token_ids) for w in windows])
        return real(windows, *args, **kwargs)

    monkeypatch.setattr(job_module, "stitch", spy)
    return calls
