"""Where an adapter's HF module names land in the engine's model: the linear (fused or not), the rows of its output
the HF module fills, and which rows the linear runs over (the encoder's or the decoder's)."""
from __future__ import annotations

import dataclasses
from typing import Dict, Iterable, Tuple

import torch
from torch import nn

from seq2seq_engine.errors import LoRAAdapterError
from seq2seq_engine.lora.adapter import PeftAdapter
from seq2seq_engine.models.encoder_decoder_utils import build_weight_map

ENCODER_ROWS, DECODER_ROWS = "encoder", "decoder"
# Logits projections: PEFT can adapt them, the engine serves the head unadapted (tied to the embeddings in most
# families, and computed on the sampled rows only).
HEAD_MODULES = ("lm_head", "proj_out")


@dataclasses.dataclass(frozen=True)
class Target:
    """One HF linear inside the engine's model: `module` (the engine's module name), the first output row and the
    number of rows it fills there, and the rows it runs over (ENCODER_ROWS or DECODER_ROWS)."""

    module: str
    offset: int
    rows: int
    domain: str
    in_features: int


@dataclasses.dataclass
class MappedAdapter:
    """An adapter laid out for the engine's linears: module -> (A [rank_sum, in], B [out, rank_sum]) where the HF
    modules fused into one linear stack their A rows and place their B blocks at their output rows; the scaling is
    folded into B."""

    adapter_path: str
    weights: Dict[str, Tuple[torch.Tensor, torch.Tensor]]

    @property
    def nbytes(self) -> int:
        return sum(a.numel() * a.element_size() + b.numel() * b.element_size() for a, b in self.weights.values())


def lora_targets(model: nn.Module) -> Dict[str, Target]:
    """HF linear module name -> Target for every linear of `model` an adapter may adapt (heads excluded). The names
    come from a fresh copy of the model's class on the meta device, so packing or quantization of `model` (which
    replaces its linears) does not matter."""
    if not getattr(model, "supports_lora", False):
        raise ValueError(f"{type(model).__name__} does not serve LoRA adapters (enable_lora)")
    with torch.device("meta"):
        fresh = type(model)(model.config)
    weight_map = fresh.hf_weight_targets() if hasattr(fresh, "hf_weight_targets") else build_weight_map(fresh)
    linears = {name for name, module in fresh.named_modules() if isinstance(module, nn.Linear)}
    targets: Dict[str, Target] = {}
    for hf_name, (param, shard) in weight_map.items():
        module, _, leaf = param.rpartition(".")
        if leaf != "weight" or module not in linears or module.split(".")[-1] in HEAD_MODULES:
            continue
        linear = fresh.get_submodule(module)
        rows = shard or (0, linear.out_features)
        targets[hf_name[:-len(".weight")]] = Target(module, rows[0], rows[1], _domain(fresh, module),
                                                    linear.in_features)
    return targets


def _domain(model: nn.Module, module: str) -> str:
    """The rows a linear runs over: the encoder's for encoder layers and for the cross-attention K/V projections
    (a module lists those in `encoder_row_linears`), else the decoder's."""
    parent, _, child = module.rpartition(".")
    if child in getattr(model.get_submodule(parent), "encoder_row_linears", ()):
        return ENCODER_ROWS
    return ENCODER_ROWS if "encoder" in module.split(".") else DECODER_ROWS


def fused_ranks(targets: Iterable[Target], max_rank: int) -> Dict[str, int]:
    """module -> the rank its slots hold: max_rank for each HF module fused into it."""
    counts: Dict[str, int] = {}
    for target in targets:
        counts[target.module] = counts.get(target.module, 0) + max_rank
    return counts


def map_adapter(adapter: PeftAdapter, targets: Dict[str, Target]) -> MappedAdapter:
    """The adapter's modules laid onto the engine's linears; LoRAAdapterError names a module that is not one."""
    grouped: Dict[str, list] = {}
    for hf_module, lora in adapter.modules.items():
        target = targets.get(hf_module)
        if target is None:
            raise LoRAAdapterError(f"adapter {adapter.path}: module {hf_module!r} cannot be adapted: "
                                   f"{_refusal_reason(hf_module)}")
        if lora.a.shape[1] != target.in_features or lora.b.shape[0] != target.rows:
            raise LoRAAdapterError(f"adapter {adapter.path}: module {hf_module!r} maps {lora.a.shape[1]} inputs to "
                                   f"{lora.b.shape[0]} outputs; the model's maps {target.in_features} to "
                                   f"{target.rows} (an adapter of another base model?)")
        grouped.setdefault(target.module, []).append((target, lora))
    weights = {}
    for module, parts in grouped.items():
        a = torch.cat([lora.a for _, lora in parts])
        out_features = max(t.offset + t.rows for t, _ in parts)
        b = torch.zeros(out_features, a.shape[0])
        column = 0
        for target, lora in parts:
            b[target.offset:target.offset + target.rows, column:column + lora.rank] = lora.b * lora.scaling
            column += lora.rank
        weights[module] = (a, b)
    return MappedAdapter(adapter.path, weights)


def _refusal_reason(hf_module: str) -> str:
    leaf = hf_module.split(".")[-1]
    if leaf in HEAD_MODULES:
        return "LoRA on the logits head is not supported"
    if "embed" in leaf or leaf in ("shared", "wte", "wpe"):
        return "LoRA on an embedding is not supported"
    if leaf.startswith("conv"):
        return "LoRA on a convolution is not supported"
    return "it is not a linear layer of this model"
