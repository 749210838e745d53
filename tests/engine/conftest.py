"""Fixtures of the engine tests: one tiny random checkpoint per family (BART, T5, Whisper, Llama) for a module."""
import pytest
from hf_reference import build_tiny_model
from t5_reference import build_tiny_t5

FAMILY_VOCAB = 256


@pytest.fixture(scope="module")
def family_models(tmp_path_factory):
    """{family: model directory}, vocabularies of FAMILY_VOCAB tokens."""
    built = {arch: build_tiny_model(arch, tmp_path_factory.mktemp(arch))[0] for arch in ("bart", "whisper", "llama")}
    built["t5"] = build_tiny_t5("t5", tmp_path_factory.mktemp("t5"), vocab_size=FAMILY_VOCAB)[0]
    return built
