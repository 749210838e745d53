"""Token timing from cross-attention (openai-whisper / transformers semantics): normalise, median-filter, DTW."""
from __future__ import annotations

from typing import Tuple

import numpy as np
import torch

FRAME_SECONDS = 0.02        # one encoder frame (two 10 ms mel frames)
MEDIAN_FILTER_WIDTH = 7


def median_filter(weights: torch.Tensor, width: int = MEDIAN_FILTER_WIDTH) -> torch.Tensor:
    """Median over a sliding window of `width` (odd) along the last axis, edges reflect-padded.

    The `width` shifted copies go through the first width // 2 + 1 passes of a bubble sort (minimum and maximum of
    neighbours), which leave the median in the middle: elementwise passes over the input's size, against a sort of
    width-long rows that makes width values and int64 indices per cell (6x slower, and ~70 MB at a time for a
    whisper-base window). An input with NaN takes the sort, where NaN ranks last, as openai-whisper's does."""
    if width <= 0 or width % 2 != 1:
        raise ValueError(f"the median filter width must be a positive odd number, got {width}")
    pad = width // 2
    if weights.shape[-1] <= pad:
        return weights
    shape, frames = weights.shape, weights.shape[-1]
    padded = torch.nn.functional.pad(weights.reshape(-1, 1, frames), (pad, pad), mode="reflect")
    if torch.isnan(weights).any():
        return padded.unfold(-1, width, 1).sort()[0][..., pad].reshape(shape)
    shifted = [padded[:, 0, k:k + frames] for k in range(width)]
    for done in range(pad + 1):   # each pass moves the largest of the unsorted front to its end
        for i in range(width - 1 - done):
            low, high = shifted[i], shifted[i + 1]
            shifted[i], shifted[i + 1] = torch.minimum(low, high), torch.maximum(low, high)
    return shifted[pad].reshape(shape)


def alignment_matrix(weights: torch.Tensor, width: int = MEDIAN_FILTER_WIDTH) -> torch.Tensor:
    """weights [heads, tokens, frames] (probabilities) → [tokens, frames]: standardised over tokens per head and
    frame, median-filtered along frames (width 7, reflect padding), averaged over heads. DTW over −matrix then
    gives each token's start frame (token_start_frames); one encoder frame is 0.02 s."""
    std, mean = torch.std_mean(weights.float(), dim=-2, keepdim=True, unbiased=False)
    return median_filter((weights - mean) / std, width).mean(dim=0)


def dtw(cost_matrix: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """Dynamic time warping over `cost_matrix` [N, M] (minimum total cost; steps diagonal, down, right; ties go
    right then down, as openai/HF). Returns (row indices, column indices) of the path from (0, 0) to (N-1, M-1).

    Vectorised over anti-diagonals: cell (i, j) depends only on the two previous anti-diagonals.
    """
    rows, cols = cost_matrix.shape
    x = cost_matrix.astype(np.float32)
    cost = np.full((rows + 1, cols + 1), np.inf, dtype=np.float32)
    trace = np.full((rows + 1, cols + 1), -1, dtype=np.int8)
    cost[0, 0] = 0
    for diagonal in range(2, rows + cols + 1):
        i = np.arange(max(1, diagonal - cols), min(rows, diagonal - 1) + 1)
        j = diagonal - i
        c0, c1, c2 = cost[i - 1, j - 1], cost[i - 1, j], cost[i, j - 1]
        step = np.where((c0 < c1) & (c0 < c2), 0, np.where((c1 < c0) & (c1 < c2), 1, 2)).astype(np.int8)
        best = np.where(step == 0, c0, np.where(step == 1, c1, c2))
        cost[i, j] = x[i - 1, j - 1] + best
        trace[i, j] = step
    return _backtrace(trace)


def _backtrace(trace: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    trace = trace.copy()
    trace[0, :] = 2
    trace[:, 0] = 1
    i, j = trace.shape[0] - 1, trace.shape[1] - 1
    path_rows, path_cols = [], []
    while i > 0 or j > 0:
        path_rows.append(i - 1)
        path_cols.append(j - 1)
        step = trace[i, j]
        if step == 0:
            i, j = i - 1, j - 1
        elif step == 1:
            i -= 1
        else:
            j -= 1
    return np.array(path_rows[::-1]), np.array(path_cols[::-1])


def token_start_frames(matrix: torch.Tensor) -> np.ndarray:
    """matrix [tokens, frames] (alignment_matrix) → the first frame of each token's row on the DTW path
    ([tokens] ints)."""
    rows, cols = dtw(-matrix.double().cpu().numpy())
    jumps = np.pad(np.diff(rows), (1, 0), constant_values=1).astype(bool)
    return cols[jumps]


def scores_to_weights(scores: torch.Tensor, num_frames: int) -> torch.Tensor:
    """Scaled q·kᵀ [heads, tokens, frames] → attention probabilities over the first `num_frames` frames
    (openai re-normalises over the window's audio only)."""
    return scores[..., :num_frames].float().softmax(dim=-1)
