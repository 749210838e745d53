"""Fixtures shared by the transcription tests (registered in tests/conftest.py): the packaged whisper-tiny.en, an
engine on it with a small KV pool, a spy on the tokens of each stitched window, and a check that a test left no
KV block behind."""
import pytest
from conftest import require_model

from seq2seq_engine.transcription.schedule import result_assembler


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
    real = result_assembler.stitch

    def spy(windows, *args, **kwargs):
        calls.append([list(w.token_ids) for w in windows])
        return real(windows, *args, **kwargs)

    monkeypatch.setattr(result_assembler, "stitch", spy)
    return calls


@pytest.fixture()
def no_leaked_blocks(request):
    """After the test, the engine of `tiny_llm` (when the test used it) holds no request and every device and swap
    block is free again."""
    yield
    if "tiny_llm" not in request.fixturenames:
        return
    engine = request.getfixturevalue("tiny_llm").llm_engine
    manager = engine.scheduler.block_manager
    assert not engine.has_unfinished_requests()
    assert manager.get_num_free_gpu_blocks() == engine.cache_config.num_gpu_blocks
    assert manager.get_num_free_cpu_blocks() == engine.cache_config.num_cpu_blocks
