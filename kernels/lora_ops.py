"""Grouped LoRA for batches of rows with mixed adapters (punica's shrink/expand): the runs of a step, the dispatch."""
from __future__ import annotations

import functools
import logging
from typing import TYPE_CHECKING, Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F

from seq2seq_engine.platforms import current_platform

from .native_lora import MAX_RANK, native_apply, native_expand, native_fits, native_shrink

if TYPE_CHECKING:
    import numpy

__all__ = ["LoRARuns", "lora_apply", "lora_expand", "lora_shrink"]

logger = logging.getLogger(__name__)

# Dispatch, per call, from the operands: float32 CPU tensors (rank <= MAX_RANK, unit stride along rows) run the
# native kernel of kernels/csrc/lora_cpu.c; CUDA tensors of TRITON_DTYPES run kernels/triton_lora.py where the CUDA
# platform chose its Triton kernels (its probe, as for paged attention); anything else, and every path that is not
# there, runs the torch path (one F.linear per distinct slot, index_select / index_add_ where a slot's rows are not
# one run). SEQ2SEQ_ENGINE_NATIVE_KERNELS=0 forces the torch path on the CPU, as for every native kernel.

# The Triton kernels' dtypes (all operands alike); the torch path computes in any floating dtype F.linear takes.
TRITON_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# A group of the torch path: its slot and its rows (a slice when they are one run, else their indices).
Group = Tuple[int, Union[slice, torch.Tensor]]


class LoRARuns:
    """The runs of equal adapter slots in a step's rows, found once per step and read by every layer.

    ``slots`` [rows]: each row's adapter slot, -1 for none (int32, on the device it came from). ``runs``: (start,
    end, slot) of each run whose slot is >= 0, in row order (a run is rows start..end-1); ``host_runs``: the same as
    int64 CPU tensors (starts, ends, slots). ``is_empty``: no row has an adapter; ``single_slot``: the slot every
    row has when they all have the same slot >= 0, else None; ``max_slot``: the largest slot (-1 when empty). The
    grouping by slot (native kernels and torch path) and the Triton kernels' tile tables are computed on first use
    and kept."""

    def __init__(self, host: torch.Tensor, device: torch.device):
        """Use ``from_slots``; ``host``: the slots as an int64 CPU tensor, ``device``: where they came from."""
        self._host = host
        self.slots = host.to(device, torch.int32)
        self.num_rows = int(host.numel())
        change = torch.ones(self.num_rows, dtype=torch.bool)
        change[1:] = host[1:] != host[:-1]
        starts = change.nonzero().flatten()
        ends = torch.cat([starts[1:], torch.tensor([self.num_rows])]) if self.num_rows else starts
        run_slots = host[starts]
        kept = run_slots >= 0
        self.host_runs = (starts[kept], ends[kept], run_slots[kept])
        self.runs = list(zip(*(column.tolist() for column in self.host_runs)))
        self.num_runs = len(self.runs)
        self.is_empty = self.num_runs == 0
        self.max_slot = max((slot for _, _, slot in self.runs), default=-1)
        whole = self.num_runs == 1 and self.runs[0][:2] == (0, self.num_rows)
        self.single_slot: Optional[int] = self.runs[0][2] if whole else None
        self._groups: Dict[torch.device, List[Group]] = {}
        self._tiles: Dict[tuple, Tuple[torch.Tensor, torch.Tensor]] = {}

    @classmethod
    def from_slots(cls, slots: Union[torch.Tensor, "numpy.ndarray", Sequence[int]]) -> "LoRARuns":
        """The runs of ``slots`` (one int per row, -1: no adapter); a CUDA tensor is read to the host once."""
        device = slots.device if isinstance(slots, torch.Tensor) else torch.device("cpu")
        host = torch.as_tensor(slots).reshape(-1).to("cpu", torch.int64)
        if host.numel() and int(host.min()) < -1:
            raise ValueError(f"LoRARuns: slots are >= 0 or -1 (no adapter), got {int(host.min())}")
        return cls(host, device)

    @functools.cached_property
    def host_groups(self) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The rows with an adapter grouped by slot (the grouping permutation), int64 CPU tensors: rows [n] (each
        slot's rows in order, slots ascending), then per distinct slot its starts and ends in ``rows`` and the slot."""
        with_adapter = (self._host >= 0).nonzero().flatten()
        keys, order = torch.sort(self._host[with_adapter], stable=True)
        slots, counts = torch.unique_consecutive(keys, return_counts=True)
        ends = counts.cumsum(0)
        return with_adapter[order], ends - counts, ends, slots

    def groups(self, device: torch.device) -> List[Group]:
        """(slot, rows) per distinct slot for the torch path: the rows a slice where the slot has one run, else the
        indices of its rows (its share of ``host_groups``) on ``device``."""
        device = torch.device(device)
        if device not in self._groups:
            rows, starts, ends, slots = self.host_groups
            # a slot's rows are one run where its last row is as far from its first as its count says
            contiguous = (rows[ends - 1] - rows[starts] == ends - starts - 1).tolist() if len(slots) else []
            groups: List[Group] = []
            for start, end, slot, one_run in zip(starts.tolist(), ends.tolist(), slots.tolist(), contiguous):
                first = int(rows[start])
                groups.append((slot, slice(first, first + end - start) if one_run else rows[start:end].to(device)))
            self._groups[device] = groups
        return self._groups[device]

    def tile_table(self, block_rows: int, device: torch.device) -> Tuple[torch.Tensor, torch.Tensor]:
        """The Triton kernels' tables on ``device``: tiles int32 [2, num_tiles] (first row, run index) cutting each
        run into ``block_rows`` rows, and runs int32 [2, num_runs] (end row, slot)."""
        key = (block_rows, torch.device(device))
        if key not in self._tiles:
            firsts, owners = [], []
            for index, (start, end, _) in enumerate(self.runs):
                firsts.extend(range(start, end, block_rows))
                owners.extend([index] * len(range(start, end, block_rows)))
            tiles = torch.tensor([firsts, owners], dtype=torch.int32).reshape(2, -1)
            runs = torch.stack([self.host_runs[1], self.host_runs[2]]).to(torch.int32)
            self._tiles[key] = (tiles.to(key[1]), runs.to(key[1]))
        return self._tiles[key]


def lora_shrink(x: torch.Tensor, a: torch.Tensor, runs: LoRARuns) -> torch.Tensor:
    """t [rows, rank] = x[i] a[slot_i]^T for each row with an adapter (zeros in the other rows), in x's dtype.

    x [rows, in]; a [slots, rank, in] (LoRA A of every slot, the rank padded alike)."""
    _check_input(runs, x, "x", a, "a", a.shape[2])
    t = torch.zeros(x.shape[0], a.shape[1], dtype=x.dtype, device=x.device)
    if runs.is_empty or a.shape[1] == 0:
        return t
    path = _path(a.shape[1], x, a, t)
    if path == "native":
        native_shrink(x, a, runs, t)
    elif path == "triton":
        _triton_module().triton_shrink(x, a, runs, t)
    else:
        for slot, rows in runs.groups(x.device):
            if isinstance(rows, slice):
                t[rows] = F.linear(x[rows], a[slot])
            else:
                t.index_copy_(0, rows, F.linear(x.index_select(0, rows), a[slot]))
    return t


def lora_expand(t: torch.Tensor, b: torch.Tensor, runs: LoRARuns, y: torch.Tensor) -> None:
    """y[i] += t[i] b[slot_i]^T in place for each row with an adapter (other rows untouched, bit for bit).

    t [rows, rank]; b [slots, out, rank] (LoRA B with its scaling folded in); y [rows, out], any strides (a column
    slice of a wider output runs the kernels in place; a y without unit stride along its rows takes the torch
    path)."""
    _check_input(runs, t, "t", b, "b", b.shape[2])
    _check_output(runs, t, b, y)
    if runs.is_empty or b.shape[1] == 0:
        return
    path = _path(b.shape[2], t, b, y)
    if path == "native":
        native_expand(t, b, runs, y)
    elif path == "triton":
        _triton_module().triton_expand(t, b, runs, y)
    else:
        for slot, rows in runs.groups(y.device):
            if isinstance(rows, slice):
                y[rows].add_(F.linear(t[rows], b[slot]))
            else:
                y.index_add_(0, rows, F.linear(t.index_select(0, rows), b[slot]))


def lora_apply(x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, runs: LoRARuns, y: torch.Tensor) -> None:
    """y[i] += (x[i] a[slot_i]^T) b[slot_i]^T in place for each row with an adapter: ``lora_shrink`` then
    ``lora_expand`` (the native kernel does both per tile of rows, the torch path per slot)."""
    _check_input(runs, x, "x", a, "a", a.shape[2])
    if b.dim() != 3 or b.shape[0] != a.shape[0] or b.shape[2] != a.shape[1]:
        raise ValueError(f"lora_apply: b must be [{a.shape[0]} slots, out, rank {a.shape[1]}] like a "
                         f"{tuple(a.shape)}, got {tuple(b.shape)}")
    _check_output(runs, x, b, y)
    if runs.is_empty or a.shape[1] == 0 or b.shape[1] == 0:
        return
    path = _path(a.shape[1], x, a, b, y)
    if path == "native":
        native_apply(x, a, b, runs, y)
    elif path == "triton":
        module = _triton_module()  # t in float32 between the kernels (F.linear's path rounds it to x's dtype)
        t = torch.empty(x.shape[0], a.shape[1], dtype=torch.float32, device=x.device)
        module.triton_shrink(x, a, runs, t)
        module.triton_expand(t, b, runs, y)
    else:
        for slot, rows in runs.groups(y.device):
            if isinstance(rows, slice):
                y[rows].add_(F.linear(F.linear(x[rows], a[slot]), b[slot]))
            else:
                y.index_add_(0, rows, F.linear(F.linear(x.index_select(0, rows), a[slot]), b[slot]))


def _check_input(runs: LoRARuns, x: torch.Tensor, x_name: str, w: torch.Tensor, w_name: str, width: int) -> None:
    """ValueError unless x [rows, width] and w [slots, *, *] fit the runs and agree in dtype and device."""
    if not isinstance(runs, LoRARuns):
        raise TypeError(f"runs must be a LoRARuns, got {type(runs).__name__}")
    if x.dim() != 2 or w.dim() != 3 or x.shape != (runs.num_rows, width):
        raise ValueError(f"LoRA: {x_name} must be [{runs.num_rows} rows, {width}] and {w_name} [slots, *, *], got "
                         f"{tuple(x.shape)} and {tuple(w.shape)}")
    if runs.max_slot >= w.shape[0]:
        raise ValueError(f"LoRA: slot {runs.max_slot} is past the {w.shape[0]} slots of {w_name}")
    if not x.dtype.is_floating_point or w.dtype != x.dtype or w.device != x.device:
        raise ValueError(f"LoRA: {x_name} ({x.dtype} on {x.device}) and {w_name} ({w.dtype} on {w.device}) must "
                         f"be floating point of one dtype on one device")


def _check_output(runs: LoRARuns, x: torch.Tensor, b: torch.Tensor, y: torch.Tensor) -> None:
    """ValueError unless y is [rows, out] of b's out, in x's dtype on its device."""
    if y.shape != (runs.num_rows, b.shape[1]) or y.dtype != x.dtype or y.device != x.device:
        raise ValueError(f"LoRA: y must be {x.dtype} [{runs.num_rows}, {b.shape[1]}] on {x.device}, got {y.dtype} "
                         f"{tuple(y.shape)} on {y.device}")


def _path(rank: int, *tensors: torch.Tensor) -> str:
    """"native" for float32 CPU tensors the native kernels take (and built), "triton" for CUDA tensors where the
    CUDA platform chose the Triton kernels, else "torch"."""
    first = tensors[0]
    if any(tensor.stride(-1) != 1 for tensor in tensors):
        return "torch"
    if first.device.type == "cpu":
        return "native" if rank <= MAX_RANK and native_fits(*tensors) else "torch"
    if first.is_cuda and first.dtype in TRITON_DTYPES and _triton_module() is not None:
        return "triton"
    return "torch"


def _triton_module():
    """kernels/triton_lora.py where the CUDA platform chose the Triton kernels and the module loads, else None."""
    if current_platform("cuda").paged_kernels != "triton":
        return None
    return _load_triton()


@functools.lru_cache(maxsize=None)
def _load_triton():
    try:
        from . import triton_lora
    except ImportError as error:
        logger.warning("the Triton LoRA kernels do not load (%s): LoRA runs the torch path on CUDA", error)
        return None
    return triton_lora if triton_lora.triton_available() else None
