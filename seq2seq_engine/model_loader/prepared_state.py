"""A prepared model (weights loaded, linears packed or quantized) as named tensors plus a JSON layout, and back."""
from __future__ import annotations

from typing import Any, Dict, List, Tuple

import torch
from torch import nn

from seq2seq_engine.models.int8 import Int8Embedding, Int8Linear
from seq2seq_engine.models.packed_linear import PackedLinear

PREPARED_KINDS = {cls.__name__: cls for cls in (PackedLinear, Int8Linear, Int8Embedding)}
_SCALARS = (bool, int, float, str, type(None))


class PreparedMismatch(ValueError):
    """The prepared tensors and layout do not fit the model being built (the code or the model changed)."""


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def _is_prepared(module: nn.Module) -> bool:
    return type(module).__name__ in PREPARED_KINDS and isinstance(module, PREPARED_KINDS[type(module).__name__])


def _plain_tensors(module: nn.Module) -> Dict[str, torch.Tensor]:
    """Tensors a module holds as plain attributes (neither parameters nor buffers), e.g. rotary frequencies."""
    return {name: value for name, value in vars(module).items()
            if isinstance(value, torch.Tensor) and not name.startswith("_")}


def _own_tensors(module: nn.Module) -> Dict[str, torch.Tensor]:
    tensors = {name: value for name, value in module._parameters.items() if value is not None}
    tensors.update((name, value) for name, value in module._buffers.items() if value is not None)
    tensors.update(_plain_tensors(module))
    return tensors


def describe(model: nn.Module) -> List[list]:
    """[name, class, {scalar attribute: value}] for every module (shared ones under each name)."""
    rows = []
    for name, module in model.named_modules(remove_duplicate=False):
        scalars = {key: (str(value) if isinstance(value, torch.dtype) else value)
                   for key, value in sorted(vars(module).items())
                   if not key.startswith("_") and isinstance(value, _SCALARS + (torch.dtype,))}
        rows.append([name, type(module).__qualname__, scalars])
    return rows


class _TensorTable:
    """Unique tensors by name; a tensor seen again (a tied weight) becomes an alias of its first name."""

    def __init__(self) -> None:
        self.tensors: Dict[str, torch.Tensor] = {}
        self.aliases: Dict[str, str] = {}
        self._views: Dict[tuple, str] = {}
        self._storages: set = set()

    def add(self, name: str, tensor: torch.Tensor) -> None:
        tensor = tensor.detach()
        view = (tensor.data_ptr(), tensor.dtype, tuple(tensor.shape), tensor.stride())
        if view in self._views:
            self.aliases[name] = self._views[view]
            return
        storage = tensor.untyped_storage().data_ptr()
        if storage in self._storages or not tensor.is_contiguous():   # a file holds each byte once, contiguous
            tensor = tensor.clone(memory_format=torch.contiguous_format)
        self._storages.add(storage)
        self._views[view] = name
        self.tensors[name] = tensor


def snapshot(model: nn.Module) -> Tuple[Dict[str, Any], Dict[str, torch.Tensor]]:
    """(layout, tensors) of a prepared model (after load_model prepared it): `restore` rebuilds it from these and a
    skeleton of its class."""
    table, prepared, module_aliases, seen = _TensorTable(), {}, {}, {}
    for name, module in model.named_modules(remove_duplicate=False):
        if id(module) in seen:
            if _is_prepared(module):
                module_aliases[name] = seen[id(module)]
            continue
        seen[id(module)] = name
        if _is_prepared(module):
            facts, tensors = module.prepared_state()
            prepared[name] = {"kind": type(module).__name__, "facts": facts, "tensors": sorted(tensors)}
            for key, tensor in tensors.items():
                table.add(_join(name, key), tensor)
            continue
        for key, tensor in _own_tensors(module).items():
            table.add(_join(name, key), tensor)
    none_children = [_join(name, child) for name, module in model.named_modules()
                     for child, value in module._modules.items() if value is None]
    layout = {"prepared": prepared, "module_aliases": module_aliases, "none_children": none_children,
              "tensor_aliases": table.aliases, "modules": describe(model)}
    return layout, table.tensors


def _set_submodule(model: nn.Module, name: str, module) -> None:
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, child, module)


class _Source:
    """The file's tensors by name (aliases resolved), remembering which ones were used."""

    def __init__(self, tensors: Dict[str, torch.Tensor], aliases: Dict[str, str]) -> None:
        self.tensors, self.aliases, self.used = tensors, aliases, set()
        self.parameters: Dict[str, nn.Parameter] = {}   # tied parameters stay one object

    def tensor(self, name: str) -> torch.Tensor:
        key = self.aliases.get(name, name)
        if key not in self.tensors:
            raise PreparedMismatch(f"no prepared tensor for {name!r}")
        self.used.add(key)
        return self.tensors[key]

    def parameter(self, name: str) -> nn.Parameter:
        key = self.aliases.get(name, name)
        if key not in self.parameters:
            self.parameters[key] = nn.Parameter(self.tensor(name))
        return self.parameters[key]


def _fill_module(module: nn.Module, prefix: str, source: _Source) -> None:
    for name, value in module._parameters.items():
        if value is not None:
            module._parameters[name] = source.parameter(_join(prefix, name))
    for name, value in module._buffers.items():
        if value is not None:
            module._buffers[name] = source.tensor(_join(prefix, name))
    for name in _plain_tensors(module):
        setattr(module, name, source.tensor(_join(prefix, name)))


def restore(skeleton: nn.Module, layout: Dict[str, Any], tensors: Dict[str, torch.Tensor]) -> nn.Module:
    """The prepared model, from a skeleton of its class (built, not loaded) and snapshot's output. Nothing is built
    from values: the prepared layers (PREPARED_KINDS) come back through their `from_prepared`, every other
    parameter, buffer or plain tensor attribute takes its tensor as given (memory-mapped ones stay mapped). The
    result must describe itself (module names, classes, scalar attributes) exactly as the prepared model did and use
    every tensor; anything else is a PreparedMismatch."""
    source = _Source(tensors, layout["tensor_aliases"])
    for name, record in layout["prepared"].items():
        kind = PREPARED_KINDS.get(record["kind"])
        if kind is None:
            raise PreparedMismatch(f"unknown prepared layer kind {record['kind']!r}")
        local = {key: source.tensor(_join(name, key)) for key in record["tensors"]}
        _set_submodule(skeleton, name, kind.from_prepared(record["facts"], local))
    for name, first in layout["module_aliases"].items():
        _set_submodule(skeleton, name, skeleton.get_submodule(first))
    for name in layout["none_children"]:
        _set_submodule(skeleton, name, None)
    filled = set()
    for name, module in skeleton.named_modules(remove_duplicate=False):
        if not _is_prepared(module) and id(module) not in filled:
            filled.add(id(module))
            _fill_module(module, name, source)
    unused = set(tensors) - source.used
    if unused:
        raise PreparedMismatch(f"prepared tensors the model does not have: {sorted(unused)[:5]}")
    skeleton.eval()
    if describe(skeleton) != layout["modules"]:
        raise PreparedMismatch("the restored model's layers or attributes differ from the prepared ones")
    return skeleton
