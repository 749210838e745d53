"""T5's bucketed relative position bias as a paged decode kernel computes it in place: the table and the bucket
parameters behind a StepPositionBias, found where its functions are a T5-style layer's `buckets` and `lookup`."""
from __future__ import annotations

import dataclasses
import math
import weakref
from typing import Any, Optional

import torch

from seq2seq_engine.attention.position_bias import StepPositionBias

# Bucket functions already compared with t5_relative_buckets, by the module that owns them: result of the comparison.
_checked: "weakref.WeakKeyDictionary[Any, bool]" = weakref.WeakKeyDictionary()


@dataclasses.dataclass(frozen=True)
class BucketedTable:
    """A relative position bias that is `table[bucket(key - query), head]` with T5's buckets: table
    [num_buckets, num_heads], and the bucket parameters."""
    table: torch.Tensor
    num_buckets: int
    max_distance: int
    bidirectional: bool


def t5_relative_buckets(relative: torch.Tensor, bidirectional: bool, num_buckets: int,
                        max_distance: int) -> torch.Tensor:
    """T5's bucket of each relative position (key minus query), as HF's `T5Attention._relative_position_bucket`
    computes it: exact buckets for small distances, logarithmic ones up to max_distance."""
    buckets = torch.zeros_like(relative)
    if bidirectional:
        num_buckets //= 2
        buckets = buckets + (relative > 0).long() * num_buckets
        distance = relative.abs()
    else:
        distance = -torch.minimum(relative, torch.zeros_like(relative))
    exact = num_buckets // 2
    large = exact + (torch.log(distance.float() / exact) / math.log(max_distance / exact)
                     * (num_buckets - exact)).to(torch.long)
    large = torch.minimum(large, torch.full_like(large, num_buckets - 1))
    return buckets + torch.where(distance < exact, distance, large)


def _t5_buckets(owner: Any, to_buckets) -> bool:
    """Whether `to_buckets` (a method of `owner`) is T5's bucket function with the owner's parameters: compared
    with t5_relative_buckets over CPU positions once per owner."""
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
                                t5_relative_buckets(relative, bidirectional, num_buckets, max_distance)))
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
