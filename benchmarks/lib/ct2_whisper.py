"""The faster-whisper peer of the GPU throughput benchmark: CTranslate2's Whisper `generate` on a batch of feature
windows (what faster-whisper's batched pipeline calls per batch), on the same random weights converted to its format.

On CUDA, CTranslate2's build needs cuBLAS 12 (`libcublas.so.12`) and cuDNN 9 for the encoder's convolutions: found on
the library path, or preloaded from torch's `nvidia-*-cu12` wheels; when either is missing the peer is skipped and
the reason is printed (the GPU check's log keeps it)."""
from __future__ import annotations

import ctypes
import glob
import json
import os
import site
from typing import Any, List, Optional, Tuple

import numpy as np
import torch

# Whisper large-v3's special tokens by id (the random weights come without a tokenizer, so the converted model's
# vocabulary is written here: CTranslate2 finds the prompt's and the task's tokens by these names)
EOT = 50257
SPECIAL = {EOT: "<|endoftext|>", 50258: "<|startoftranscript|>", 50259: "<|en|>", 50359: "<|translate|>",
           50360: "<|transcribe|>", 50361: "<|startoflm|>", 50362: "<|startofprev|>", 50363: "<|nospeech|>",
           50364: "<|notimestamps|>"}
LANGUAGES = range(50259, 50359)
FIRST_TIMESTAMP = 50365

# soname, torch's wheel folder holding it
CUDA_LIBRARIES = (("libcublas.so.12", "cublas"), ("libcudnn.so.9", "cudnn"))


def _preload(soname: str, package: str) -> Optional[str]:
    """None when `soname` loads (from the library path or torch's nvidia wheels, preloaded globally so that
    CTranslate2's own dlopen finds it), else why not."""
    try:
        ctypes.CDLL(soname, mode=ctypes.RTLD_GLOBAL)
        return None
    except OSError:
        pass
    folders = site.getsitepackages() + [site.getusersitepackages()]
    for path in [p for folder in folders for p in glob.glob(os.path.join(folder, "nvidia", package, "lib", soname))]:
        try:
            ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
            return None
        except OSError:
            continue
    return f"{soname} is missing (neither on the library path nor in torch's nvidia-{package}-cu12 wheel)"


def load(model_dir: str, device: str, dtype: str) -> Tuple[Optional[Any], str]:
    """(CTranslate2 Whisper on `device`, a note) for the HF Whisper saved in `model_dir`, or (None, why not)."""
    try:
        import ctranslate2
    except ImportError as error:
        return None, f"ctranslate2 does not import ({error})"
    if device == "cuda":
        if ctranslate2.get_cuda_device_count() == 0:
            return None, f"ctranslate2 {ctranslate2.__version__} sees no CUDA device (a CPU-only build?)"
        missing = [reason for reason in (_preload(*lib) for lib in CUDA_LIBRARIES) if reason]
        if missing:
            return None, "; ".join(missing)
    out_dir = f"{model_dir}-ct2"
    quantization = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}[dtype]
    ctranslate2.converters.TransformersConverter(model_dir).convert(out_dir, quantization=quantization, force=True)
    _write_vocabulary(out_dir)
    model = ctranslate2.models.Whisper(out_dir, device=device, compute_type=quantization)
    return model, f"ctranslate2 {ctranslate2.__version__}, {quantization} on {device}"


def _write_vocabulary(out_dir: str) -> None:
    """large-v3's token layout: plain tokens, the special ones, 100 languages, 1501 timestamps."""
    with open(os.path.join(out_dir, "vocabulary.json")) as f:
        size = len(json.load(f))
    vocabulary = []
    for token_id in range(size):
        if token_id in SPECIAL:
            vocabulary.append(SPECIAL[token_id])
        elif token_id in LANGUAGES:
            vocabulary.append(f"<|lang{token_id}|>")
        elif token_id >= FIRST_TIMESTAMP:
            vocabulary.append(f"<|{(token_id - FIRST_TIMESTAMP) * 0.02:.2f}|>")
        else:
            vocabulary.append(f"t{token_id}")
    with open(os.path.join(out_dir, "vocabulary.json"), "w") as f:
        json.dump(vocabulary, f)
    config_path = os.path.join(out_dir, "config.json")
    with open(config_path) as f:
        config = json.load(f)
    config["lang_ids"] = list(LANGUAGES)
    with open(config_path, "w") as f:
        json.dump(config, f)


def generate(model: Any, features: List[torch.Tensor], prompt: List[int], eos: int, new_tokens: int) -> List[List[int]]:
    """Greedy tokens of every window in one `generate` call: `new_tokens` each (EOS suppressed, as the other engines
    run with min_tokens), the forced prompt not included."""
    import ctranslate2
    batch = ctranslate2.StorageView.from_array(np.ascontiguousarray(torch.stack(features).numpy()))
    # CTranslate2 4.8 stops after min(max_length // 2, max_length - len(prompt) + 1) new tokens (measured, 1 to 100)
    max_length = next(m for m in range(new_tokens, 4 * new_tokens + len(prompt) + 1)
                      if min(m // 2, m - len(prompt) + 1) == new_tokens)
    results = model.generate(batch, [list(prompt)] * len(features), beam_size=1, max_length=max_length,
                             suppress_blank=False, suppress_tokens=[eos])
    tokens = [list(result.sequences_ids[0]) for result in results]
    if any(len(t) != new_tokens for t in tokens):
        raise RuntimeError(f"CTranslate2 returned {sorted({len(t) for t in tokens})} tokens, not {new_tokens}: its "
                           "max_length no longer means what benchmarks/lib/ct2_whisper.py assumes")
    return tokens
