"""The adapters one engine serves: registered requests, an LRU of read adapters in host memory (`max_cpu_loras`),
and `max_loras` device slots filled for the adapters of each step (least recently used slot replaced first)."""
from __future__ import annotations

import collections
import itertools
import logging
from typing import Dict, Iterable, List, Optional

import torch
from torch import nn

from seq2seq_engine.errors import LoRAAdapterError
from seq2seq_engine.lora.adapter import read_peft_adapter
from seq2seq_engine.lora.layers import LoRALinear
from seq2seq_engine.lora.targets import MappedAdapter, fused_ranks, lora_targets, map_adapter
from seq2seq_engine.lora_request import LoRAConfig, LoRARequest

logger = logging.getLogger(__name__)


class LoRAManager:
    """Wraps every adaptable linear of `model` in a LoRALinear (at construction, so the model's execution paths
    are the same whether or not an adapter is loaded) and keeps the adapters."""

    def __init__(self, model: nn.Module, config: LoRAConfig, dtype: torch.dtype, device: torch.device) -> None:
        self.config, self.dtype, self.device = config, dtype, torch.device(device)
        self.targets = lora_targets(model)
        self.layers = self._wrap(model)
        self.requests: Dict[int, LoRARequest] = {}
        self._host: "collections.OrderedDict[int, MappedAdapter]" = collections.OrderedDict()
        # A cache tag per registration: the KV caches key content by it, so an id removed and registered again with
        # another adapter never finds the blocks the first one computed.
        self._cache_tags: Dict[int, int] = {}
        self._tag_counter = itertools.count(1)
        self._slot_ids: List[Optional[int]] = [None] * config.max_loras
        self._slot_last_use = [0] * config.max_loras
        self._clock = 0

    def _wrap(self, model: nn.Module) -> Dict[str, LoRALinear]:
        ranks = fused_ranks(self.targets.values(), self.config.max_lora_rank)
        domains = {target.module: target.domain for target in self.targets.values()}
        layers = {}
        for module, rank in ranks.items():
            parent_name, _, child = module.rpartition(".")
            parent = model.get_submodule(parent_name)
            base = getattr(parent, child)
            in_features, out_features = base.in_features, base.out_features
            layer = LoRALinear(base, domains[module], in_features, out_features, self.config.max_loras, rank)
            setattr(parent, child, layer)
            layers[module] = layer
        return layers

    # ----------------------------------------------------------------- registration
    def add_adapter(self, request: LoRARequest) -> None:
        """Register `request` and read its adapter into host memory (at once, so a bad adapter is refused when it
        is named); an id already registered must name the same path."""
        known = self.requests.get(request.lora_int_id)
        if known is not None and known.lora_path != request.lora_path:
            raise LoRAAdapterError(f"lora_int_id {request.lora_int_id} already names adapter {known.lora_name!r} "
                                   f"at {known.lora_path}, not {request.lora_path}")
        self._host_adapter(request)
        self.requests[request.lora_int_id] = request
        self._cache_tags.setdefault(request.lora_int_id, next(self._tag_counter))

    def cache_tag(self, lora_int_id: int) -> int:
        """The tag the KV caches key an adapter's content by (0 without an adapter): one per registration."""
        return self._cache_tags[lora_int_id] if lora_int_id else 0

    def remove_adapter(self, lora_int_id: int) -> bool:
        """Forget an adapter (its slot and host copy); False when it was not registered."""
        if self.requests.pop(lora_int_id, None) is None:
            return False
        self._host.pop(lora_int_id, None)
        self._cache_tags.pop(lora_int_id, None)
        for slot, held in enumerate(self._slot_ids):
            if held == lora_int_id:
                self._slot_ids[slot] = None
        return True

    def _host_adapter(self, request: LoRARequest) -> MappedAdapter:
        mapped = self._host.get(request.lora_int_id)
        if mapped is None:
            adapter = read_peft_adapter(request.lora_path, self.config.max_lora_rank)
            mapped = map_adapter(adapter, self.targets)
            self._host[request.lora_int_id] = mapped
            logger.info("LoRA adapter %s (id %d) read from %s: %d linears, %.1f MiB", request.lora_name,
                        request.lora_int_id, request.lora_path, len(mapped.weights), mapped.nbytes / 2 ** 20)
            while len(self._host) > self.config.max_cpu_loras:
                self._host.popitem(last=False)
        self._host.move_to_end(request.lora_int_id)
        return mapped

    # ----------------------------------------------------------------- slots
    def activate(self, lora_ids: Iterable[int]) -> Dict[int, int]:
        """Slot of each adapter id (every id one the engine registered), filling slots as needed; at most
        max_loras ids (the scheduler admits no more adapters into one step)."""
        wanted = sorted(set(lora_ids))
        if len(wanted) > self.config.max_loras:
            raise RuntimeError(f"a step holds {len(wanted)} adapters, more than max_loras={self.config.max_loras}")
        self._clock += 1
        slots = {}
        for lora_id in wanted:
            if lora_id in self._slot_ids:
                slot = self._slot_ids.index(lora_id)
            else:
                slot = self._free_slot(wanted)
                self._fill(slot, lora_id)
            self._slot_last_use[slot] = self._clock
            slots[lora_id] = slot
        return slots

    def _free_slot(self, keep: List[int]) -> int:
        candidates = [slot for slot, held in enumerate(self._slot_ids) if held not in keep]
        return min(candidates, key=lambda slot: (self._slot_ids[slot] is not None, self._slot_last_use[slot]))

    def _fill(self, slot: int, lora_id: int) -> None:
        request = self.requests.get(lora_id)
        if request is None:
            raise LoRAAdapterError(f"no adapter with lora_int_id {lora_id} is loaded")
        mapped = self._host_adapter(request)
        for module, layer in self.layers.items():
            layer.set_slot(slot, mapped.weights.get(module), self.dtype, self.device)
        self._slot_ids[slot] = lora_id

    def host_bytes(self, lora_int_id: int) -> int:
        """Host bytes of a read adapter (0 when it is not in the host LRU)."""
        mapped = self._host.get(lora_int_id)
        return mapped.nbytes if mapped is not None else 0

    @property
    def slot_bytes(self) -> int:
        """Device bytes the slot stacks hold, all slots together."""
        return sum(layer.slot_bytes for layer in self.layers.values())
