"""Position-dependent attention biases (T5's relative position bias) as the backends apply them: a float mask per
prefill block shape and a [num_seqs, num_heads, context] bias for paged decode, computed from positions once per
forward pass (StepPositionBias) and handed to every layer that shares the table."""
from __future__ import annotations

from typing import Callable, Dict, List, Tuple, Union

import torch

# Relative positions (key position minus query position, int64, any shape) -> additive bias [num_heads, *shape].
PositionBiasFn = Callable[[torch.Tensor], torch.Tensor]


class StepRelativeBuckets:
    """The bucket index of every relative position (key minus query) of one forward pass's prefill blocks and decode
    rows, each computed on first use and then reused: layers with their own bias tables (UMT5) share these."""

    def __init__(self, to_buckets: Callable[[torch.Tensor], torch.Tensor]) -> None:
        self.to_buckets = to_buckets
        self._prefill: Dict[tuple, torch.Tensor] = {}
        self._decode: List[Tuple[torch.Tensor, int, torch.Tensor]] = []

    def prefill(self, q_len: int, k_len: int, device: torch.device) -> torch.Tensor:
        """Buckets [q_len + k_len - 1] of the relative positions -(k_len - 1) .. q_len - 1: the diagonals of a block
        whose queries are its last q_len positions (bottom-right aligned: a prefill continuing a cached context).
        Entry (i, j) of the block is diagonal j - i + q_len - 1, so the block's buckets are these, unfolded."""
        key = (q_len, k_len, device)
        if key not in self._prefill:
            self._prefill[key] = self.to_buckets(torch.arange(-(k_len - 1), q_len, device=device))
        return self._prefill[key]

    def decode(self, context_lens: torch.Tensor, max_len: int) -> torch.Tensor:
        """Buckets [num_seqs, max_len] of each decode query (the last position of its context) against cached
        positions 0..max_len-1. The step's context lengths are one tensor that every layer passes."""
        for lens, length, buckets in self._decode:
            if lens is context_lens and length == max_len:
                return buckets
        query_positions = context_lens.to(torch.int64)[:, None] - 1
        relative = torch.arange(max_len, device=context_lens.device)[None, :] - query_positions
        buckets = self.to_buckets(relative)
        self._decode.append((context_lens, max_len, buckets))
        return buckets


class StepPositionBias:
    """One bias table's prefill masks and decode bias for one forward pass, computed on first use and reused by
    every later layer (T5 and mT5 layers share one table, so one object serves a whole stack). ``lookup`` maps
    bucket indices to the additive bias [num_heads, *shape]."""

    def __init__(self, buckets: StepRelativeBuckets, lookup: Callable[[torch.Tensor], torch.Tensor]) -> None:
        self.buckets = buckets
        self.lookup = lookup
        self._masks: Dict[tuple, torch.Tensor] = {}
        self._decode: List[Tuple[torch.Tensor, int, torch.Tensor]] = []

    def prefill_mask(self, q_len: int, k_len: int, causal: bool, dtype: torch.dtype,
                     device: torch.device) -> torch.Tensor:
        """Additive float mask [1, num_heads, q_len, k_len] (contiguous) of one prefill block whose queries are
        its last q_len positions; -inf on future keys when causal."""
        key = (q_len, k_len, causal, dtype, device)
        if key not in self._masks:
            # the bias of each diagonal, spread over the block: window w of the unfolded diagonals is row
            # q_len - 1 - w (a Toeplitz matrix, so the buckets and table lookups scale with q_len + k_len)
            diagonals = self.lookup(self.buckets.prefill(q_len, k_len, device)).to(dtype)
            mask = diagonals.unfold(1, k_len, 1).flip(1)
            if causal:  # future keys: relative position j - (k_len - q_len + i) > 0
                future = torch.ones(q_len, k_len, dtype=torch.bool, device=device).triu(k_len - q_len + 1)
                mask = mask.masked_fill(future, float("-inf"))
            self._masks[key] = mask.unsqueeze(0).contiguous()
        return self._masks[key]

    def decode_bias(self, context_lens: torch.Tensor, max_len: int) -> torch.Tensor:
        """Float32 bias [num_seqs, num_heads, max_len] (contiguous) of each decode query against cached positions
        0..max_len-1; entries past a sequence's context are never used (the kernels mask them)."""
        for lens, length, bias in self._decode:
            if lens is context_lens and length == max_len:
                return bias
        bias = self.lookup(self.buckets.decode(context_lens, max_len)).transpose(0, 1).float().contiguous()
        self._decode.append((context_lens, max_len, bias))
        return bias


def as_step_bias(position_bias: Union[PositionBiasFn, StepPositionBias]) -> StepPositionBias:
    """A StepPositionBias as given, or one over a plain function of relative positions (then nothing is shared
    beyond the one call that builds it)."""
    if isinstance(position_bias, StepPositionBias):
        return position_bias
    return StepPositionBias(StepRelativeBuckets(lambda relative: relative), position_bias)
