"""Load a model directory (HF layout: config.json + safetensors or pytorch_model.bin weights, possibly sharded)
into one of the engine's model classes."""
from __future__ import annotations

import json
import os
from typing import Iterator, List, Optional, Tuple, Union

import torch
from torch.nn import init
from torch.overrides import TorchFunctionMode

from seq2seq_engine.model_loader.config_file import load_config
from seq2seq_engine.models.registry import resolve_model_class

SAFETENSORS = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
PYTORCH_BIN = "pytorch_model.bin"
PYTORCH_BIN_INDEX = "pytorch_model.bin.index.json"


def _shard_files(model_dir: str, index_name: str) -> List[str]:
    with open(os.path.join(model_dir, index_name), encoding="utf-8") as f:
        weight_map = json.load(f).get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise ValueError(f"{index_name} in {model_dir} has no weight_map")
    files = list(dict.fromkeys(weight_map.values()))
    for name in files:
        if not os.path.isfile(os.path.join(model_dir, name)):
            raise FileNotFoundError(f"weight shard {name!r} named by {index_name} is missing from {model_dir}")
    return [os.path.join(model_dir, name) for name in files]


def weight_files(model_dir: str) -> Tuple[str, List[str]]:
    """("safetensors" | "pytorch", [files]) in order of preference: model.safetensors, its sharded index,
    pytorch_model.bin, its sharded index."""
    if os.path.isfile(os.path.join(model_dir, SAFETENSORS)):
        return "safetensors", [os.path.join(model_dir, SAFETENSORS)]
    if os.path.isfile(os.path.join(model_dir, SAFETENSORS_INDEX)):
        return "safetensors", _shard_files(model_dir, SAFETENSORS_INDEX)
    if os.path.isfile(os.path.join(model_dir, PYTORCH_BIN)):
        return "pytorch", [os.path.join(model_dir, PYTORCH_BIN)]
    if os.path.isfile(os.path.join(model_dir, PYTORCH_BIN_INDEX)):
        return "pytorch", _shard_files(model_dir, PYTORCH_BIN_INDEX)
    raise FileNotFoundError(f"no weight files in {model_dir}: expected {SAFETENSORS}, {SAFETENSORS_INDEX}, "
                            f"{PYTORCH_BIN} or {PYTORCH_BIN_INDEX}")


def iterate_weights(model_dir: str) -> Iterator[Tuple[str, torch.Tensor]]:
    """(name, CPU tensor) for every tensor of the directory's checkpoint, one file at a time."""
    kind, files = weight_files(model_dir)
    for path in files:
        if kind == "safetensors":
            from safetensors import safe_open
            with safe_open(path, framework="pt", device="cpu") as f:
                for name in f.keys():
                    yield name, f.get_tensor(name)
        else:
            try:
                state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
            except RuntimeError:  # legacy (non-zip) serialization cannot be memory-mapped
                state = torch.load(path, map_location="cpu", weights_only=True)
            yield from state.items()
            del state


def load_model(model_dir: Union[str, os.PathLike], dtype: torch.dtype = torch.float32,
               device: Union[str, torch.device] = "cpu", quantization: Optional[str] = None,
               linear_weight_dtype: Optional[torch.dtype] = None, prepared: bool = False,
               cache_dir: Optional[str] = None):
    """(model, hf_config): the engine model for the directory's architecture, weights loaded, cast to `dtype`,
    moved to `device`, in eval mode; with quantization="int8" its Linear layers then run in int8
    (seq2seq_engine.models.int8). A float32 CPU model's linears run on packed weights, kept in
    `linear_weight_dtype` (float32 by default; bfloat16 computed in float32). With `prepared`, a CPU model comes
    from its prepared-weights file (model_loader/prepared_cache.py: memory-mapped, nothing packed or quantized
    again), which the first such load writes."""
    model_dir = os.fspath(model_dir)
    hf_config = load_config(model_dir)
    model_class = resolve_model_class(getattr(hf_config, "architectures", None))
    refused = getattr(model_class, "refused_dtypes", {}).get(dtype)
    if refused is not None:
        raise ValueError(f"dtype {str(dtype).replace('torch.', '')!r} is not supported by {model_class.__name__}: "
                         f"{refused}")
    _, files = weight_files(model_dir)  # fail on a directory without weights before building the model
    cache = None
    if prepared and torch.device(device).type == "cpu":
        from seq2seq_engine.model_loader.prepared_cache import PreparedWeights
        cache = PreparedWeights(model_dir, files, dtype, quantization, linear_weight_dtype, cache_dir)
        model = cache.load(lambda: build_model(model_class, hf_config))
        if model is not None:
            return _with_attention_dtype(model, quantization), hf_config
    model = build_model(model_class, hf_config)
    model.load_weights(iterate_weights(model_dir))
    model = model.to(device=device, dtype=dtype)
    model.eval()
    if quantization is not None:
        from seq2seq_engine.models.int8 import quantize_model
        quantize_model(model, quantization)
    elif dtype == torch.float32 and torch.device(device).type == "cpu":
        from seq2seq_engine.models.packed_linear import pack_float32_model
        pack_float32_model(model, linear_weight_dtype or torch.float32)
    model.eval()   # the layers that replaced linears too
    if cache is not None:
        cache.save(model)
    return _with_attention_dtype(model, quantization), hf_config


def _with_attention_dtype(model, quantization: Optional[str]):
    """The model with its encoder self-attention computing in the dtype the CPU platform picks for it."""
    if quantization is None:
        return model
    from seq2seq_engine.attention.layer import compute_encoder_attention_in
    from seq2seq_engine.platforms import current_platform

    dtype = current_platform("cpu").encoder_attention_dtype(quantization)
    compute_encoder_attention_in(model, getattr(torch, dtype))
    return model


class _SkipRandomInit(TorchFunctionMode):
    """Skips torch.nn.init's random fills while a model is built (this thread only): every parameter is then
    loaded, strictly, or restored, so the fills would only cost time (0.4 s of Whisper base's 0.45 s build)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _RANDOM_FILLS:
            return args[0] if args else kwargs["tensor"]
        return func(*args, **kwargs)


_RANDOM_FILLS = frozenset({torch.Tensor.uniform_, torch.Tensor.normal_, init.uniform_, init.normal_,
                           init.trunc_normal_, init.kaiming_uniform_, init.kaiming_normal_, init.xavier_uniform_,
                           init.xavier_normal_, init.orthogonal_})


def build_model(model_class, hf_config):
    """`model_class(hf_config)` with its parameters allocated but not randomly filled."""
    with _SkipRandomInit():
        return model_class(hf_config)
