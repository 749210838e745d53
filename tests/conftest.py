"""Shared pytest fixtures: a tiny sentencepiece tokenizer trained offline (BART-like special ids), the kernel
paths, single-threaded torch for the real-model comparison modules."""
import random

import pytest

SPM_VOCAB_SIZE = 200
SPM_SPECIAL_IDS = {"bos": 0, "pad": 1, "eos": 2, "unk": 3}


def _training_lines(num_lines: int = 600, seed: int = 0):
    rng = random.Random(seed)
    syllables = ["ka", "lo", "mi", "ne", "ru", "sa", "to", "vi", "ze", "pa", "qu", "er", "in", "on", "the", "and"]
    words = ["".join(rng.choice(syllables) for _ in range(rng.randint(1, 3))) for _ in range(300)]
    words += "hello world the quick brown fox jumps over lazy dog encoder decoder audio speech".split()
    return [" ".join(rng.choice(words) for _ in range(rng.randint(4, 14))) for _ in range(num_lines)]


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
        for library in ("paged_attention_cpu", "fused_ops_cpu"):
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
