"""Position-dependent attention biases (T5's relative position bias) as the backends apply them: a float mask per
prefill block and a [num_seqs, num_heads, context] bias for paged decode, both computed from positions each step."""
from __future__ import annotations

from typing import Callable

import torch

# Relative positions (key position minus query position, int64, any shape) -> additive bias [num_heads, *shape].
PositionBiasFn = Callable[[torch.Tensor], torch.Tensor]


def prefill_bias_mask(position_bias: PositionBiasFn, q_len: int, k_len: int, causal: bool, dtype: torch.dtype,
                      device: torch.device) -> torch.Tensor:
    """Additive float mask [1, num_heads, q_len, k_len] of one prefill block whose queries are its last q_len
    positions (bottom-right aligned: a prefill continuing a cached context); -inf on future keys when causal."""
    query_positions = torch.arange(k_len - q_len, k_len, device=device)[:, None]
    key_positions = torch.arange(k_len, device=device)[None, :]
    relative = key_positions - query_positions
    mask = position_bias(relative).to(dtype)
    if causal:
        mask = mask.masked_fill(relative > 0, float("-inf"))
    return mask.unsqueeze(0)


def decode_position_bias(position_bias: PositionBiasFn, context_lens: torch.Tensor, max_len: int) -> torch.Tensor:
    """Bias [num_seqs, num_heads, max_len] of each decode query (the last position of its context) against cached
    positions 0..max_len-1; entries past a sequence's context are never used (the kernel masks them)."""
    query_positions = context_lens.to(torch.int64)[:, None] - 1
    relative = torch.arange(max_len, device=context_lens.device)[None, :] - query_positions
    return position_bias(relative).transpose(0, 1).float().contiguous()
