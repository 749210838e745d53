"""T5's relative position buckets: the one bucket function the T5 model, its CUDA decode bias and the Triton kernel's
bucket table share."""
from __future__ import annotations

import math

import torch


def relative_position_bucket(relative: torch.Tensor, bidirectional: bool, num_buckets: int,
                             max_distance: int) -> torch.Tensor:
    """Bucket index of each relative position (key minus query), as HF's `T5Attention._relative_position_bucket`
    computes it: half of the buckets (per direction when bidirectional) hold exact distances, the rest distances
    growing logarithmically up to max_distance; a unidirectional (decoder) bucket only sees the distance to earlier
    keys."""
    buckets = torch.zeros_like(relative)
    if bidirectional:
        num_buckets //= 2
        buckets = buckets + (relative > 0).long() * num_buckets
        distance = relative.abs()
    else:
        distance = (-relative).clamp(min=0)
    exact = num_buckets // 2
    # log of 0 (small distances) gives -inf; those entries take the exact branch below
    log_part = torch.log(distance.float() / exact) / math.log(max_distance / exact) * (num_buckets - exact)
    far = (exact + log_part.to(torch.long)).clamp(max=num_buckets - 1)
    return buckets + torch.where(distance < exact, distance, far)
