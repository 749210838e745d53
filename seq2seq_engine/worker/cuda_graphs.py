"""CUDA graphs of decode steps: one graph per batch-size bucket, captured on first use over static input buffers."""
from __future__ import annotations

import bisect
import dataclasses
import logging
from typing import Callable, Dict, List, Mapping, Optional, Sequence as Seq, Tuple

import numpy as np
import torch

from seq2seq_engine.attention.metadata import AttentionMetadata, CrossAttentionMetadata, SelfAttentionMetadata

logger = logging.getLogger(__name__)

# Largest batch a decode graph is captured for (vLLM's default); bigger decode steps run eagerly.
MAX_GRAPH_BATCH_SIZE = 256
_ALIGNMENT = 64   # bytes between the fields of the static buffer: every field starts 16-byte aligned for kernels

Step = Callable[[], torch.Tensor]
# Turns the decode forward over the static buffers into what a step replays: a CUDA graph, or on CPU the forward
GraphCapture = Callable[[Step], Step]


def graph_batch_sizes(max_num_seqs: int, cap: int = MAX_GRAPH_BATCH_SIZE) -> List[int]:
    """The batch-size buckets graphs are captured for: 1, 2, 4, 8, then multiples of 8, up to the bucket that holds
    min(max_num_seqs, cap)."""
    if max_num_seqs <= 0 or cap <= 0:
        raise ValueError(f"max_num_seqs and cap must be positive, got {max_num_seqs} and {cap}")
    largest = min(max_num_seqs, cap)
    sizes = [size for size in (1, 2, 4) if size < largest]
    sizes += list(range(8, largest + 8, 8)) if largest > 4 else [4 if largest > 2 else largest]
    return sizes


def graph_batch_size(num_seqs: int, batch_sizes: Seq[int]) -> Optional[int]:
    """The smallest bucket that holds num_seqs rows; None when num_seqs is 0 or past the largest bucket."""
    index = bisect.bisect_left(batch_sizes, num_seqs)
    return batch_sizes[index] if num_seqs > 0 and index < len(batch_sizes) else None


@dataclasses.dataclass(frozen=True)
class GraphField:
    """One static input of the decode graphs: `width` columns per row (None: one value per row), and the value
    of padding rows (slot -1: nothing is written; context length 0: the attention output row is zeros)."""

    name: str
    dtype: torch.dtype
    width: Optional[int]
    fill: int


def decode_graph_fields(self_table_width: int, cross_table_width: int) -> Tuple[GraphField, ...]:
    """The static inputs: token ids, positions, slots, sampled rows and self block tables / context lengths, plus the
    cross block tables and encoder lengths when cross_table_width > 0 (encoder/decoder models)."""
    fields = [GraphField("input_ids", torch.int64, None, 0), GraphField("positions", torch.int64, None, 0),
              GraphField("slot_mapping", torch.int64, None, -1), GraphField("selected", torch.int64, None, 0),
              GraphField("context_lens", torch.int32, None, 0),
              GraphField("block_tables", torch.int32, self_table_width, 0)]
    if cross_table_width:
        fields += [GraphField("encoder_lens", torch.int32, None, 0),
                   GraphField("cross_block_tables", torch.int32, cross_table_width, 0)]
    return tuple(fields)


def field_layout(fields: Seq[GraphField], batch_size: int) -> Tuple[Dict[str, Tuple[int, Tuple[int, ...]]], int]:
    """({name: (byte offset, shape)}, bytes used) of `batch_size` rows of each field packed one after the other, so
    that one copy of the first `bytes used` bytes moves a step's inputs."""
    layout, offset = {}, 0
    for field in fields:
        shape = (batch_size,) if field.width is None else (batch_size, field.width)
        layout[field.name] = (offset, shape)
        num_bytes = int(np.prod(shape)) * torch.empty((), dtype=field.dtype).element_size()
        offset += -(-num_bytes // _ALIGNMENT) * _ALIGNMENT
    return layout, offset


def pad_rows(values: np.ndarray, batch_size: int, fill: int) -> np.ndarray:
    """`values` (one entry or row per real sequence) followed by rows of `fill` up to batch_size rows."""
    values = np.asarray(values)
    if len(values) > batch_size:
        raise ValueError(f"{len(values)} rows do not fit a batch of {batch_size}")
    padded = np.full((batch_size,) + values.shape[1:], fill, dtype=values.dtype)
    padded[:len(values)] = values
    return padded


def table_rows(tables: Seq[Seq[int]], width: int) -> np.ndarray:
    """Block tables as an int32 [len(tables), width] array, each row padded with block 0."""
    rows = np.zeros((len(tables), width), dtype=np.int32)
    for i, table in enumerate(tables):
        if len(table) > width:
            raise ValueError(f"a block table of {len(table)} blocks does not fit the {width} columns of the graphs")
        rows[i, :len(table)] = table
    return rows


def run_eagerly(step: Step) -> Step:
    """A GraphCapture that captures nothing: the padded decode forward runs as it is (CPU, tests)."""
    return step


class CudaGraphCapture:
    """Captures each step into a CUDA graph; all graphs share one memory pool (only one replays at a time)."""

    def __init__(self, device: torch.device) -> None:
        self.device = torch.device(device)
        self.pool = None

    def __call__(self, step: Step) -> Step:
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        # A warm-up run on a side stream does the lazy work (library handles, kernel compilation) that must not be
        # captured; it computes what the replay computes, so writing the step's K/V twice is harmless.
        current = torch.cuda.current_stream(self.device)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(current)
        with torch.cuda.stream(side):
            step()
        current.wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        # thread_local: other threads of a server may use CUDA while this one captures
        with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):
            output = step()

        def replay() -> torch.Tensor:
            graph.replay()
            return output

        return replay


@dataclasses.dataclass(frozen=True)
class GraphStep:
    """A decode step's inputs as the graphs read them: static device views of `batch_size` rows (real rows first,
    then padding), and the rows to sample (indices into the real rows)."""

    batch_size: int
    input_ids: torch.Tensor
    positions: torch.Tensor
    attn_metadata: AttentionMetadata
    selected: torch.Tensor


class DecodeGraphs:
    """The decode step of one model as graphs over one static buffer: per step the padded inputs are written to a
    (pinned) host copy of the buffer and moved by one non-blocking copy, then the bucket's graph replays. Graphs are
    captured the first time their bucket is needed; they hold the KV caches they were captured with."""

    def __init__(self, model: torch.nn.Module, device: torch.device, batch_sizes: Seq[int], block_size: int,
                 self_table_width: int, cross_table_width: int, capture: GraphCapture) -> None:
        self.model = model
        self.device = torch.device(device)
        self.batch_sizes = list(batch_sizes)
        self.cross_table_width = cross_table_width
        self.fields = decode_graph_fields(self_table_width, cross_table_width)
        # Upper bounds of the context lengths: the kernels size their work from these, never from the data
        self.max_context_lens = (self_table_width * block_size, cross_table_width * block_size)
        self.capture = capture
        self.disabled = False
        _, num_bytes = field_layout(self.fields, self.batch_sizes[-1])
        on_cuda = self.device.type == "cuda"
        self._host = torch.zeros(num_bytes, dtype=torch.uint8, pin_memory=on_cuda)
        self._buffer = torch.zeros(num_bytes, dtype=torch.uint8, device=self.device)
        self._copied = torch.cuda.Event() if on_cuda else None
        self._inputs: Dict[int, Tuple[Dict[str, torch.Tensor], AttentionMetadata]] = {}
        self._host_views: Dict[int, Tuple[Dict[str, np.ndarray], int]] = {}
        self._steps: Dict[int, Step] = {}
        self._caches_key: Optional[tuple] = None

    def batch_size_for(self, num_rows: int) -> Optional[int]:
        """The bucket a decode step of num_rows sequences replays, or None: it runs eagerly."""
        return None if self.disabled else graph_batch_size(num_rows, self.batch_sizes)

    def _views(self, buffer: torch.Tensor, batch_size: int) -> Dict[str, torch.Tensor]:
        layout, _ = field_layout(self.fields, batch_size)
        views = {}
        for field in self.fields:
            offset, shape = layout[field.name]
            num_bytes = int(np.prod(shape)) * torch.empty((), dtype=field.dtype).element_size()
            views[field.name] = buffer[offset:offset + num_bytes].view(field.dtype).view(shape)
        return views

    def _static_inputs(self, batch_size: int) -> Tuple[Dict[str, torch.Tensor], AttentionMetadata]:
        if batch_size not in self._inputs:
            views = self._views(self._buffer, batch_size)
            self_md = SelfAttentionMetadata(
                slot_mapping=views["slot_mapping"], prefill_bias=None, prefill_block_tables=None,
                decode_seq_lens=views["context_lens"], decode_block_tables=views["block_tables"],
                max_decode_seq_len=self.max_context_lens[0])
            cross_md = None
            if "cross_block_tables" in views:
                cross_md = CrossAttentionMetadata(
                    prefill_bias=None, cross_slot_mapping=None, decode_encoder_lens=views["encoder_lens"],
                    decode_block_tables=views["cross_block_tables"], max_decode_encoder_len=self.max_context_lens[1])
            metadata = AttentionMetadata(num_prefills=0, num_prefill_tokens=0, num_decode_tokens=batch_size,
                                         self_attn=self_md, encoder=None, cross=cross_md)
            self._inputs[batch_size] = (views, metadata)
        return self._inputs[batch_size]

    def prepare(self, rows: Mapping[str, np.ndarray], batch_size: int, num_samples: int) -> GraphStep:
        """Write a step's real rows (one array per field, in field order of decode_graph_fields) padded to
        batch_size into the static buffer: one host-to-device copy, queued on the current stream."""
        if self._copied is not None:
            self._copied.synchronize()      # the previous step's copy has finished reading the host buffer
        if batch_size not in self._host_views:
            views = self._views(self._host, batch_size)
            used = field_layout(self.fields, batch_size)[1]
            self._host_views[batch_size] = ({name: view.numpy() for name, view in views.items()}, used)
        host, num_bytes = self._host_views[batch_size]
        for field in self.fields:
            host[field.name][...] = pad_rows(rows[field.name], batch_size, field.fill)
        self._buffer[:num_bytes].copy_(self._host[:num_bytes], non_blocking=True)
        if self._copied is not None:
            self._copied.record()
        views, metadata = self._static_inputs(batch_size)
        return GraphStep(batch_size, views["input_ids"], views["positions"], metadata,
                         views["selected"][:num_samples])

    def run(self, batch_size: int, kv_caches) -> torch.Tensor:
        """Hidden states [batch_size, hidden] of the step prepared last (padding rows included)."""
        caches_key = tuple(tensor.data_ptr() for pair in kv_caches for tensor in pair)
        if caches_key != self._caches_key:  # graphs read the caches they were captured with
            self._steps.clear()
            self._caches_key = caches_key
        step = self._steps.get(batch_size)
        if step is None:
            step = self._capture(batch_size, kv_caches)
        return step()

    def _capture(self, batch_size: int, kv_caches) -> Step:
        views, metadata = self._static_inputs(batch_size)

        def forward() -> torch.Tensor:
            return self.model(views["input_ids"], views["positions"], kv_caches, metadata)

        if not self._steps:
            logger.info("decode steps run as CUDA graphs, each batch-size bucket captured on first use "
                        "(enforce_eager=True runs them eagerly)")
        try:
            step = self.capture(forward)
        except Exception as error:  # noqa: BLE001  any failure to capture leaves the eager path, which works
            logger.warning("the decode step of %d sequences could not be captured as a CUDA graph (%s: %s); decode "
                           "steps run eagerly from now on", batch_size, type(error).__name__, error)
            self.disabled = True
            return forward
        self._steps[batch_size] = step
        return step
