"""Architecture name (HF `config.architectures`) -> model class, imported lazily so that a module that fails to
import only breaks its own architectures."""
from __future__ import annotations

import importlib
from types import MappingProxyType
from typing import Iterable, Mapping, Optional

# "module:Class", module relative to seq2seq_engine.models.
MODEL_REGISTRY: Mapping[str, str] = MappingProxyType({
    "LlamaForCausalLM": "llama:LlamaForCausalLM",
    "GPT2LMHeadModel": "gpt2:GPT2LMHeadModel",
    "OPTForCausalLM": "opt:OPTForCausalLM",
    "BartForConditionalGeneration": "bart:BartForConditionalGeneration",
    "MBartForConditionalGeneration": "bart:MBartForConditionalGeneration",
    "WhisperForConditionalGeneration": "whisper:WhisperForConditionalGeneration",
    "MarianMTModel": "marian:MarianMTModel",
    "M2M100ForConditionalGeneration": "m2m100:M2M100ForConditionalGeneration",
    "PegasusForConditionalGeneration": "pegasus:PegasusForConditionalGeneration",
    "T5ForConditionalGeneration": "t5:T5ForConditionalGeneration",
    "MT5ForConditionalGeneration": "t5:MT5ForConditionalGeneration",
    "UMT5ForConditionalGeneration": "t5:UMT5ForConditionalGeneration",
})

_PACKAGE = __name__.rpartition(".")[0]  # "seq2seq_engine.models"


def supported_architectures():
    return sorted(MODEL_REGISTRY)


def load_model_class(architecture: str) -> type:
    """The class registered for one architecture name (ValueError if unregistered; ImportError if its module
    or class cannot be imported)."""
    if architecture not in MODEL_REGISTRY:
        raise ValueError(f"unsupported architecture {architecture!r}; supported: {supported_architectures()}")
    module_name, class_name = MODEL_REGISTRY[architecture].split(":")
    try:
        module = importlib.import_module(f"{_PACKAGE}.{module_name}")
    except ImportError as exc:
        raise ImportError(f"cannot import model module {module_name!r} for architecture {architecture!r}: "
                          f"{exc}") from exc
    try:
        return getattr(module, class_name)
    except AttributeError:
        raise ImportError(f"model module {module_name!r} has no class {class_name!r} "
                          f"(architecture {architecture!r})") from None


def resolve_model_class(architectures: Optional[Iterable[str]]) -> type:
    """The class of the first registered name in `architectures` (HF config.architectures)."""
    names = [architectures] if isinstance(architectures, str) else list(architectures or ())
    for name in names:
        if name in MODEL_REGISTRY:
            return load_model_class(name)
    raise ValueError(f"unsupported model architecture(s) {names}; supported architectures: "
                     f"{supported_architectures()}")
