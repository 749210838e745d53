"""Block-diagonal prefill attention of the torch backend (`varlen_attention`) against an explicit per-block softmax
reference on random inputs: causal (top-left and bottom-right, i.e. with cached context), non-causal, GQA, runs of
equal-shaped neighbours and mixed block lengths."""
import zlib

import pytest
import torch

from seq2seq_engine.attention.backends.torch_backend import varlen_attention
from seq2seq_engine.attention.bias import (BlockDiagonalCausalFromBottomRightMask, BlockDiagonalCausalMask,
                                           BlockDiagonalMask)


def reference(query, key, value, q_lens, k_lens, causal, bottom_right, scale):
    """Each block on its own: scores in float64, masked future keys, softmax, weighted values."""
    group = query.shape[1] // key.shape[1]
    out, q_start, k_start = [], 0, 0
    for q_len, k_len in zip(q_lens, k_lens):
        q = query[q_start:q_start + q_len].double().transpose(0, 1)
        k = key[k_start:k_start + k_len].double().repeat_interleave(group, dim=1).transpose(0, 1)
        v = value[k_start:k_start + k_len].double().repeat_interleave(group, dim=1).transpose(0, 1)
        scores = q @ k.transpose(1, 2) * scale
        if causal:
            shift = k_len - q_len if bottom_right else 0
            future = torch.arange(k_len)[None, :] > torch.arange(q_len)[:, None] + shift
            scores = scores.masked_fill(future, float("-inf"))
        out.append((scores.softmax(-1) @ v).transpose(0, 1))
        q_start, k_start = q_start + q_len, k_start + k_len
    return torch.cat(out).to(query.dtype)


def make_bias(kind, q_lens, k_lens):
    if kind == "causal":
        return BlockDiagonalCausalMask.from_seqlens(q_lens)
    if kind == "bottom_right":
        return BlockDiagonalCausalFromBottomRightMask.from_seqlens(q_lens, k_lens)
    return BlockDiagonalMask.from_seqlens(q_lens, k_lens)


CASES = {  # name: (bias kind, q lens, k lens)
    "causal, mixed prompt lengths": ("causal", [36, 43, 39, 40, 37, 43, 41], None),
    "causal, a run of equal neighbours and outliers": ("causal", [8, 8, 8, 200, 3], None),
    "bottom-right, cached context": ("bottom_right", [5, 1, 7, 5], [20, 9, 7, 30]),
    "non-causal, encoder-like lengths 1..300": ("none", [1, 300, 17, 64, 65, 250], None),
    "non-causal cross, one decoder token per block": ("none", [1, 1, 1, 1], [120, 7, 300, 64]),
}


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("num_heads,num_kv_heads", [(4, 4), (6, 2)])
def test_varlen_attention_matches_per_block_reference(name, num_heads, num_kv_heads):
    kind, q_lens, k_lens = CASES[name]
    k_lens = k_lens or q_lens
    gen = torch.Generator().manual_seed(zlib.crc32(name.encode()))
    head_size, scale = 32, 32 ** -0.5
    query = torch.randn(sum(q_lens), num_heads, head_size, generator=gen)
    key = torch.randn(sum(k_lens), num_kv_heads, head_size, generator=gen)
    value = torch.randn(sum(k_lens), num_kv_heads, head_size, generator=gen)
    got = varlen_attention(query, key, value, make_bias(kind, q_lens, k_lens), scale)
    want = reference(query, key, value, q_lens, k_lens, kind != "none", kind == "bottom_right", scale)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)


def test_varlen_attention_bfloat16_close_to_reference():
    q_lens = [12, 30, 7, 29]
    gen = torch.Generator().manual_seed(1)
    query, key, value = (torch.randn(sum(q_lens), 4, 32, generator=gen).bfloat16() for _ in range(3))
    got = varlen_attention(query, key, value, make_bias("causal", q_lens, None), 0.2)
    want = reference(query, key, value, q_lens, q_lens, True, False, 0.2)
    torch.testing.assert_close(got.float(), want.float(), atol=2e-2, rtol=2e-2)
