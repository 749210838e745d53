"""The full garbage collection an engine runs at the end of its construction (platforms/startup_gc.py)."""
import gc

import pytest
from hf_reference import build_tiny_model

from seq2seq_engine import LLM
from seq2seq_engine.platforms.startup_gc import STARTUP_GC_ENV, collect_startup_garbage


@pytest.fixture
def collections():
    """The generations of the collections that run while the test holds it."""
    generations = []

    def record(phase, info):
        if phase == "stop":
            generations.append(info["generation"])
    gc.callbacks.append(record)
    yield generations
    gc.callbacks.remove(record)


@pytest.mark.parametrize("setting, runs", [(None, True), ("1", True), ("0", False), ("off", False)])
def test_collect_startup_garbage_runs_one_full_collection_unless_off(setting, runs, monkeypatch, collections):
    if setting is None:
        monkeypatch.delenv(STARTUP_GC_ENV, raising=False)
    else:
        monkeypatch.setenv(STARTUP_GC_ENV, setting)
    assert collect_startup_garbage() is runs
    assert (2 in collections) is runs


def test_an_engine_ends_its_construction_with_a_full_collection(tmp_path, monkeypatch, collections):
    monkeypatch.delenv(STARTUP_GC_ENV, raising=False)
    model_dir, _ = build_tiny_model("bart", tmp_path)
    collections.clear()
    LLM(model_dir, skip_tokenizer_init=True, dtype="float32")
    assert collections and collections[-1] == 2
