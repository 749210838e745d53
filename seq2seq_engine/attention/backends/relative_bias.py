"""T5's bucketed relative position bias as a paged decode kernel computes it in place: the table and the bucket
parameters behind a StepPositionBias, found where its functions are a T5-style layer's `buckets` and `lookup`."""
from __future__ import annotations

import dataclasses
import weakref
from typing import Any, Optional

import torch

from seq2seq_engine.attention.position_bias import StepPositionBias
from seq2seq_engine.kernels.relative_buckets import relative_position_bucket

# Bucket functions already compared with relative_position_bucket, by the module that owns them: the result.
_checked: "weakref.WeakKeyDictionary[Any, bool]" = weakref.WeakKeyDictionary()


@dataclasses.dataclass(frozen=True)
class BucketedTable:
    """A relative position bias that is `table[bucket(key - query), head]` with T5's buckets: table
    [num_buckets, num_heads], and the bucket parameters."""
    table: torch.Tensor
    num_buckets: int
    max_distance: int
    bidirectional: bool


def _t5_buckets(owner: Any, to_buckets) -> bool:
    """Whether `to_buckets` (a method of `owner`) is T5's bucket function with the owner's parameters: compared
    with relative_position_bucket over CPU positions once per owner."""
    params = (getattr(owner, "num_buckets", None), getattr(owner, "max_distance", None),
              getattr(owner, "bidirectional", None))
    if not (isinstance(params[0], int) and isinstance(params[1], int) and isinstance(params[2], bool)):
        return False
    try:
        return _checked[owner]
    except (KeyError, TypeError):
        pass
    num_buckets, max_distance, bidirectional = params
    span = 4 * max(max_distance, num_buckets)
    relative = torch.arange(-span, span + 1)
    try:
        same = bool(torch.equal(to_buckets(relative).cpu().long(),
                                relative_position_bucket(relative, bidirectional, num_buckets, max_distance)))
    except (RuntimeError, TypeError, ValueError):
        same = False
    try:
        _checked[owner] = same
    except TypeError:  # not weak-referenceable: checked again next time
        pass
    return same


def bucketed_table(position_bias: Any) -> Optional[BucketedTable]:
    """The table and bucket parameters behind `position_bias`, or None where it is not expressible that way (a plain
    function of relative positions, or buckets other than T5's): then the caller builds the bias tensor.

    Recognised: a StepPositionBias whose `buckets.to_buckets` is the `buckets` method of a module with int
    `num_buckets`, `max_distance` and bool `bidirectional` (checked against T5's formula once per module), and whose
    `lookup` is the `lookup` method of a module with `relative_attention_bias.weight` [num_buckets, num_heads]
    (models/t5_layers.py's T5SelfAttention)."""
    if not isinstance(position_bias, StepPositionBias):
        return None
    to_buckets, lookup = position_bias.buckets.to_buckets, position_bias.lookup
    bucket_owner, table_owner = getattr(to_buckets, "__self__", None), getattr(lookup, "__self__", None)
    if getattr(to_buckets, "__name__", None) != "buckets" or getattr(lookup, "__name__", None) != "lookup":
        return None
    weight = getattr(getattr(table_owner, "relative_attention_bias", None), "weight", None)
    if not _t5_buckets(bucket_owner, to_buckets) or not isinstance(weight, torch.Tensor) or weight.dim() != 2:
        return None
    if weight.shape[0] != bucket_owner.num_buckets:
        return None
    return BucketedTable(weight, bucket_owner.num_buckets, bucket_owner.max_distance, bucket_owner.bidirectional)


def decode_query_positions(context_lens: torch.Tensor) -> torch.Tensor:
    """Each decode row's query position (the last of its context) as int32, on the lengths' device."""
    return (context_lens - 1).to(torch.int32)
