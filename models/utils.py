"""Small helpers shared by the model definitions: strict weight loading and activation functions.

Weight loading is strict by design: a checkpoint tensor that maps to no parameter, a parameter that no tensor
filled, a tensor of the wrong shape, or the same parameter (shard) loaded twice all raise ValueError naming the
checkpoint tensor or parameter. Models translate HF checkpoint names to their own parameter names (and fused
projections to shards) and hand each tensor to a `WeightLoader`:

    loader = WeightLoader(self, allow_missing=("lm_head.weight",), ignore=IGNORED_BUFFER_PATTERNS)
    for name, tensor in weights:
        if loader.ignored(name):
            continue
        loader.load("layers.0.attn.qkv_proj.weight", tensor, source=name, shard=(0, q_size))  # rows 0..q_size
    loader.finish()   # raises ValueError listing every parameter (or shard) left unfilled
"""
from __future__ import annotations

import math
import re
from types import MappingProxyType
from typing import Callable, Dict, Iterable, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

# Non-parameter tensors that HF checkpoints may carry (causal-mask buffers, rotary caches): skipped on load.
IGNORED_BUFFER_PATTERNS: Tuple[str, ...] = (
    r"(^|\.)rotary_emb\.inv_freq$",
    r"(^|\.)attn\.bias$",            # GPT-2 causal mask buffer (old checkpoints)
    r"(^|\.)attn\.masked_bias$",     # GPT-2
    r"(^|\.)rotary_emb\.(cos|sin)_cached$",
)

Shard = Tuple[int, int]  # (offset, size) along dim `shard_dim` of a fused parameter


class WeightLoader:
    """Copies checkpoint tensors into a module's parameters with strict name, shape and coverage checks.

    `allow_missing`: parameter names that may stay unloaded (e.g. a tied lm_head whose storage is shared with
    the embeddings; note `named_parameters` already lists a tied parameter only once).
    `ignore`: regular expressions of checkpoint names to skip silently (see `IGNORED_BUFFER_PATTERNS`).
    """

    def __init__(self, module: nn.Module, *, allow_missing: Iterable[str] = (),
                 ignore: Iterable[str] = IGNORED_BUFFER_PATTERNS) -> None:
        self.params: Dict[str, torch.Tensor] = dict(module.named_parameters())
        self.allow_missing = frozenset(allow_missing)
        self._ignore = [re.compile(pattern) for pattern in ignore]
        self._loaded: Dict[str, List[Tuple[int, int, int]]] = {}  # param -> [(dim, start, end)] filled

    def ignored(self, checkpoint_name: str) -> bool:
        return any(pattern.search(checkpoint_name) for pattern in self._ignore)

    def load(self, param_name: Optional[str], tensor: torch.Tensor, *, source: Optional[str] = None,
             shard: Optional[Shard] = None, shard_dim: int = 0,
             transform: Optional[Callable[[torch.Tensor], torch.Tensor]] = None) -> None:
        """Copy `tensor` (after `transform`) into parameter `param_name`, or into rows
        `shard = (offset, size)` along `shard_dim` of it. `source` is the checkpoint name used in errors."""
        source = source or param_name
        if param_name is None or param_name not in self.params:
            raise ValueError(f"unexpected checkpoint tensor {source!r}"
                             + (f" (no parameter {param_name!r} in the model)" if param_name else ""))
        param = self.params[param_name]
        if transform is not None:
            tensor = transform(tensor)
        if shard is None:
            target, span = param.data, (shard_dim, 0, param.shape[shard_dim] if param.dim() else 1)
        else:
            offset, size = shard
            if offset < 0 or offset + size > param.shape[shard_dim]:
                raise ValueError(f"checkpoint tensor {source!r}: shard {shard} out of range for parameter "
                                 f"{param_name!r} of shape {tuple(param.shape)}")
            target, span = param.data.narrow(shard_dim, offset, size), (shard_dim, offset, offset + size)
        if tuple(tensor.shape) != tuple(target.shape):
            raise ValueError(f"shape mismatch for checkpoint tensor {source!r}: got {tuple(tensor.shape)}, "
                             f"expected {tuple(target.shape)} (parameter {param_name!r})")
        filled = self._loaded.setdefault(param_name, [])
        if any(dim == span[0] and start < span[2] and span[1] < end for dim, start, end in filled):
            raise ValueError(f"checkpoint tensor {source!r} loads parameter {param_name!r} a second time")
        filled.append(span)
        with torch.no_grad():
            target.copy_(tensor.to(dtype=target.dtype))

    def missing(self) -> List[str]:
        """Parameters (or parameter shards) that no checkpoint tensor filled, excluding `allow_missing`."""
        missing = []
        for name, param in self.params.items():
            if name in self.allow_missing:
                continue
            spans = self._loaded.get(name)
            if not spans:
                missing.append(name)
                continue
            dim = spans[0][0]
            total = param.shape[dim] if param.dim() else 1
            if sum(end - start for _, start, end in spans) != total:
                missing.append(f"{name} (partly loaded: {sorted((s, e) for _, s, e in spans)} of {total} rows)")
        return missing

    def finish(self) -> None:
        missing = self.missing()
        if missing:
            raise ValueError("checkpoint is missing tensors for parameters: " + ", ".join(missing))


def _gelu_new(x: torch.Tensor) -> torch.Tensor:
    # GPT-2's tanh approximation, written as HF's NewGELUActivation writes it.
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


def _quick_gelu(x: torch.Tensor) -> torch.Tensor:
    return x * torch.sigmoid(1.702 * x)


_ACTIVATIONS = MappingProxyType({
    "relu": F.relu,
    "gelu": F.gelu,
    "gelu_new": _gelu_new,
    "gelu_fast": _gelu_new,
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "quick_gelu": _quick_gelu,
    "silu": F.silu,
    "swish": F.silu,
    "tanh": torch.tanh,
})


def get_activation(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """The activation function HF configs name (`activation_function`, `hidden_act`)."""
    try:
        return _ACTIVATIONS[name]
    except KeyError:
        raise ValueError(f"unsupported activation {name!r}; supported: {sorted(_ACTIVATIONS)}") from None


def replace_linears(module: nn.Module, build: Callable[[nn.Linear], Optional[nn.Module]]) -> int:
    """Replace every nn.Linear inside `module` by `build(linear)`, in place, where that is not None; returns how
    many were replaced."""
    replaced = 0
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            replacement = build(child) if isinstance(child, nn.Linear) else None
            if replacement is not None:
                setattr(parent, name, replacement)
                replaced += 1
    return replaced


def head_dim_of(hidden_size: int, num_heads: int) -> int:
    """hidden_size // num_heads, refusing a hidden size that the heads do not divide."""
    if hidden_size % num_heads:
        raise ValueError(f"hidden size {hidden_size} is not divisible by {num_heads} heads")
    return hidden_size // num_heads


def fused_qkv_attention(qkv: torch.Tensor, attn: nn.Module, kv_cache, attn_metadata) -> torch.Tensor:
    """The Attention layer over the output of a fused [q | k | v] projection of three equal widths."""
    q, k, v = qkv.chunk(3, dim=-1)
    return attn(q.contiguous(), k.contiguous(), v.contiguous(), kv_cache, attn_metadata)


def as_kv_cache_list(kv_caches, num_layers: int):
    """`kv_caches` as a list of one entry per layer (None entries when the caller passed None)."""
    if kv_caches is None:
        return [None] * num_layers
    if len(kv_caches) != num_layers:
        raise ValueError(f"expected {num_layers} KV caches (one per decoder layer), got {len(kv_caches)}")
    return kv_caches
