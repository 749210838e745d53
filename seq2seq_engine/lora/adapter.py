"""A PEFT LoRA adapter directory read into per-module (A, B, scaling) tensors, refusing what the engine does not
serve with an error naming the module and the reason."""
from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from typing import Any, Dict, Mapping, Tuple

import torch

from seq2seq_engine.errors import LoRAAdapterError

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
_PREFIX = "base_model.model."
# adapter_config.json settings that change the computation in a way the engine does not reproduce: refused
_REFUSED_SETTINGS = (("use_dora", "DoRA adapters are not supported"),
                     ("modules_to_save", "fully trained modules (modules_to_save) are not supported"),
                     ("layers_to_transform", None), ("fan_in_fan_out", None))
_TENSOR = re.compile(r"^(?P<module>.+?)\.(?P<part>lora_A|lora_B|lora_embedding_A|lora_embedding_B|lora_magnitude_vector"
                     r"|lora_bias)(\.[^.]+)?(\.weight)?$|^(?P<other>.+)$")


@dataclasses.dataclass
class ModuleLoRA:
    """One adapted linear (HF module name): A [rank, in], B [out, rank] and the scaling applied to B·A·x."""

    a: torch.Tensor
    b: torch.Tensor
    scaling: float

    @property
    def rank(self) -> int:
        return self.a.shape[0]


@dataclasses.dataclass
class PeftAdapter:
    """A read adapter: its directory and the LoRA of each adapted HF module."""

    path: str
    modules: Dict[str, ModuleLoRA]


def read_peft_adapter(path: str, max_rank: int) -> PeftAdapter:
    """Read a PEFT LoRA directory; LoRAAdapterError names the file, setting or module that cannot be served."""
    config = _read_config(path)
    tensors = _read_tensors(path)
    pairs = _pair_tensors(path, tensors)
    use_rslora = bool(config.get("use_rslora", False))
    modules: Dict[str, ModuleLoRA] = {}
    for module, (a, b) in pairs.items():
        rank = a.shape[0]
        if b.dim() != 2 or a.dim() != 2 or b.shape[1] != rank:
            raise LoRAAdapterError(f"adapter {path}: module {module!r} has lora_A {tuple(a.shape)} and lora_B "
                                   f"{tuple(b.shape)}, not [rank, in] and [out, rank]")
        if rank > max_rank:
            raise LoRAAdapterError(f"adapter {path}: module {module!r} has rank {rank}, above max_lora_rank "
                                   f"{max_rank}")
        alpha = float(_pattern_value(config.get("alpha_pattern") or {}, module, config.get("lora_alpha", 8)))
        scaling = alpha / (math.sqrt(rank) if use_rslora else rank)
        modules[module] = ModuleLoRA(a.float(), b.float(), scaling)
    if not modules:
        raise LoRAAdapterError(f"adapter {path}: {WEIGHTS_FILE} holds no lora_A/lora_B tensors")
    return PeftAdapter(path, modules)


def _read_config(path: str) -> Mapping[str, Any]:
    config_path = os.path.join(path, CONFIG_FILE)
    if not os.path.isdir(path):
        raise LoRAAdapterError(f"adapter {path}: no such directory")
    try:
        with open(config_path, encoding="utf-8") as handle:
            config = json.load(handle)
    except FileNotFoundError:
        raise LoRAAdapterError(f"adapter {path}: {CONFIG_FILE} is missing (not a PEFT adapter directory)") from None
    except (OSError, ValueError) as error:
        raise LoRAAdapterError(f"adapter {path}: {CONFIG_FILE} is not readable JSON ({error})") from None
    if not isinstance(config, dict):
        raise LoRAAdapterError(f"adapter {path}: {CONFIG_FILE} must hold a JSON object")
    peft_type = str(config.get("peft_type", "LORA")).upper()
    if peft_type != "LORA":
        raise LoRAAdapterError(f"adapter {path}: peft_type {peft_type} is not LoRA")
    for key, reason in _REFUSED_SETTINGS:
        if config.get(key):
            raise LoRAAdapterError(f"adapter {path}: {key}={config[key]!r}: "
                                   f"{reason or 'this setting is not supported'}")
    if config.get("bias", "none") != "none":
        raise LoRAAdapterError(f"adapter {path}: bias={config['bias']!r}: trained biases are not supported")
    return config


def _read_tensors(path: str) -> Dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    weights_path = os.path.join(path, WEIGHTS_FILE)
    if not os.path.isfile(weights_path):
        other = " (only safetensors adapters are read)" if os.path.isfile(os.path.join(path, "adapter_model.bin")) \
            else ""
        raise LoRAAdapterError(f"adapter {path}: {WEIGHTS_FILE} is missing{other}")
    try:
        return load_file(weights_path)
    except (SafetensorError, OSError, ValueError) as error:
        raise LoRAAdapterError(f"adapter {path}: {WEIGHTS_FILE} is not a readable safetensors file ({error})") \
            from None


def _pair_tensors(path: str, tensors: Mapping[str, torch.Tensor]) -> Dict[str, Tuple[torch.Tensor, torch.Tensor]]:
    """HF module name -> (lora_A, lora_B); any other tensor is refused, named."""
    parts: Dict[str, Dict[str, torch.Tensor]] = {}
    for name, tensor in tensors.items():
        key = name[len(_PREFIX):] if name.startswith(_PREFIX) else name
        match = _TENSOR.match(key)
        module, part = match.group("module"), match.group("part")
        if part is None:
            raise LoRAAdapterError(f"adapter {path}: tensor {name!r} is not a LoRA weight (fully trained modules "
                                   f"are not supported)")
        if part.startswith("lora_embedding"):
            raise LoRAAdapterError(f"adapter {path}: module {module!r}: LoRA on an embedding is not supported")
        if part in ("lora_magnitude_vector", "lora_bias"):
            raise LoRAAdapterError(f"adapter {path}: module {module!r}: {part} (DoRA or LoRA biases) is not "
                                   f"supported")
        parts.setdefault(module, {})[part] = tensor
    for module, found in parts.items():
        if set(found) != {"lora_A", "lora_B"}:
            raise LoRAAdapterError(f"adapter {path}: module {module!r} has {sorted(found)}, not lora_A and lora_B")
    return {module: (found["lora_A"], found["lora_B"]) for module, found in parts.items()}


def _pattern_value(patterns: Mapping[str, Any], module: str, default: Any) -> Any:
    """PEFT's rank_pattern / alpha_pattern lookup: the first key matching the end of the module's name."""
    for key, value in patterns.items():
        if re.match(rf"(.*\.)?({key})$", module):
            return value
    return default
