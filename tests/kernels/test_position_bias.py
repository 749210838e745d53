"""Attention with a position bias (T5's relative position bias) against plain-torch references on random inputs:
paged decode (native C kernel and torch path, float32 and bfloat16, MHA/GQA) with a per-sequence, per-head bias
over cached positions, block-diagonal prefill with the bias of each block's positions, and the decode bias against
the last row of the prefill mask, and the per-forward-pass sharing of masks and bucket indices."""

import pytest
import torch
from attention.test_varlen_attention import make_bias
from kernel_reference import random_paged_cache, ref_gather_context

from seq2seq_engine.attention.backends.torch_backend import varlen_attention
from seq2seq_engine.attention.position_bias import StepPositionBias, StepRelativeBuckets, as_step_bias
from seq2seq_engine.kernels import paged_attention


def _reference_decode(query, key_cache, value_cache, tables, lens, scale, bias):
    """One float64 softmax per sequence and head over gathered K/V, the bias row added to the scores."""
    num_seqs, num_heads, head_size = query.shape
    group = num_heads // key_cache.shape[2]
    out = torch.zeros(num_seqs, num_heads, head_size, dtype=torch.float64)
    for seq, n in enumerate(lens):
        keys = ref_gather_context(key_cache, tables[seq].tolist(), n).double()
        values = ref_gather_context(value_cache, tables[seq].tolist(), n).double()
        for head in range(num_heads):
            scores = keys[:, head // group] @ query[seq, head].double() * scale + bias[seq, head, :n].double()
            out[seq, head] = torch.softmax(scores, dim=0) @ values[:, head // group]
    return out


@pytest.mark.parametrize("num_heads,num_kv_heads", [(5, 5), (6, 2)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("head_size", [12, 20])
def test_paged_decode_with_position_bias(num_heads, num_kv_heads, dtype, head_size, kernel_path):
    gen = torch.Generator().manual_seed(num_heads * 100 + head_size)
    # equal neighbours with equal tables form one run in the native kernel; each keeps its own bias row
    lens = [1, 4, 5, 5, 23, 9, 40]
    block_size = 4
    key_cache, value_cache, tables = random_paged_cache(gen, lens, block_size, num_kv_heads, head_size, dtype)
    tables[3] = tables[2]
    query = torch.randn(len(lens), num_heads, head_size, generator=gen).to(dtype)
    bias = torch.randn(len(lens), num_heads, max(lens) + 3, generator=gen) * 3.0
    context_lens = torch.tensor(lens, dtype=torch.int32)
    got = paged_attention(query, key_cache, value_cache, tables, context_lens, 1.0, position_bias=bias)
    want = _reference_decode(query, key_cache, value_cache, tables, lens, 1.0, bias)
    assert got.dtype == dtype and torch.isfinite(got).all()
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.double(), want, atol=tolerance, rtol=tolerance)
    without = paged_attention(query, key_cache, value_cache, tables, context_lens, 1.0)
    assert not torch.allclose(without.double(), want, atol=tolerance, rtol=tolerance)   # the bias counts


def test_paged_decode_refuses_a_short_or_misshapen_bias(kernel_path):
    gen = torch.Generator().manual_seed(3)
    key_cache, value_cache, tables = random_paged_cache(gen, [6, 9], 4, 2, 8, torch.float32)
    query, lens = torch.randn(2, 2, 8, generator=gen), torch.tensor([6, 9], dtype=torch.int32)
    with pytest.raises(ValueError, match="covers 8 positions, fewer than the longest context \\(9\\)"):
        paged_attention(query, key_cache, value_cache, tables, lens, 1.0, position_bias=torch.zeros(2, 2, 8))
    with pytest.raises(ValueError, match="position_bias must be \\[num_seqs=2, num_heads=2, context\\]"):
        paged_attention(query, key_cache, value_cache, tables, lens, 1.0, position_bias=torch.zeros(2, 9))


class _TableBias:
    """A random per-head value for each relative position in [-64, 64] (a stand-in for T5's bucketed table)."""

    def __init__(self, num_heads, gen):
        self.table = torch.randn(num_heads, 129, generator=gen) * 2.0

    def __call__(self, relative):
        return self.table[:, relative.clamp(-64, 64) + 64]


def _reference_prefill(query, key, value, q_lens, k_lens, causal, bias_fn):
    """Each block alone in float64: queries at the block's last q_len positions, bias added, future keys masked."""
    group = query.shape[1] // key.shape[1]
    out, q_start, k_start = [], 0, 0
    for q_len, k_len in zip(q_lens, k_lens):
        q = query[q_start:q_start + q_len].double().transpose(0, 1)
        k = key[k_start:k_start + k_len].double().repeat_interleave(group, dim=1).transpose(0, 1)
        v = value[k_start:k_start + k_len].double().repeat_interleave(group, dim=1).transpose(0, 1)
        scores = q @ k.transpose(1, 2)
        for i in range(q_len):
            for j in range(k_len):
                relative = j - (k_len - q_len + i)
                scores[:, i, j] += bias_fn(torch.tensor(relative)).double()
                if causal and relative > 0:
                    scores[:, i, j] = float("-inf")
        out.append((scores.softmax(-1) @ v).transpose(0, 1))
        q_start, k_start = q_start + q_len, k_start + k_len
    return torch.cat(out)


def _reference_mask(bias_fn, q_len, k_len, causal):
    """[1, heads, q_len, k_len], entry by entry: the bias of key j against query k_len - q_len + i, -inf on future
    keys when causal."""
    rows = []
    for i in range(q_len):
        row = []
        for j in range(k_len):
            relative = j - (k_len - q_len + i)
            value = bias_fn(torch.tensor(relative)).float()
            row.append(torch.full_like(value, float("-inf")) if causal and relative > 0 else value)
        rows.append(torch.stack(row, dim=-1))
    return torch.stack(rows, dim=-2).unsqueeze(0)


def _reference_decode_bias(bias_fn, lens, max_len):
    """[seqs, heads, max_len]: each sequence's last position (its query) against positions 0..max_len-1."""
    return torch.stack([torch.stack([bias_fn(torch.tensor(j - (n - 1))).float() for j in range(max_len)], dim=-1)
                        for n in lens.tolist()])


@pytest.mark.parametrize("kind,q_lens,k_lens", [("none", [7, 7, 1, 30], None), ("causal", [5, 5, 12, 1], None),
                                                ("bottom_right", [3, 1, 6], [9, 7, 6])])
@pytest.mark.parametrize("num_heads,num_kv_heads", [(4, 4), (6, 3)])
def test_prefill_with_position_bias(kind, q_lens, k_lens, num_heads, num_kv_heads):
    gen = torch.Generator().manual_seed(len(kind) + num_heads)
    k_lens = k_lens or q_lens
    head_size = 12
    query = torch.randn(sum(q_lens), num_heads, head_size, generator=gen)
    key = torch.randn(sum(k_lens), num_kv_heads, head_size, generator=gen)
    value = torch.randn(sum(k_lens), num_kv_heads, head_size, generator=gen)
    bias_fn = _TableBias(num_heads, gen)
    got = varlen_attention(query, key, value, make_bias(kind, q_lens, k_lens), 1.0, position_bias=bias_fn)
    want = _reference_prefill(query, key, value, q_lens, k_lens, kind != "none", bias_fn)
    torch.testing.assert_close(got.double(), want, atol=2e-5, rtol=1e-4)


def test_decode_bias_is_the_last_row_of_the_prefill_mask():
    bias_fn = _TableBias(3, torch.Generator().manual_seed(5))
    lens = torch.tensor([1, 6, 11], dtype=torch.int32)
    step_bias = as_step_bias(bias_fn)
    decode = step_bias.decode_bias(lens, 11)
    assert decode.shape == (3, 3, 11) and decode.dtype == torch.float32
    for row, n in enumerate(lens.tolist()):
        mask = step_bias.prefill_mask(n, n, True, torch.float32, torch.device("cpu"))
        torch.testing.assert_close(decode[row, :, :n], mask[0, :, -1, :], rtol=0, atol=0)


def test_step_bias_builds_each_mask_once_and_shares_buckets_between_tables():
    """One forward pass: a StepPositionBias hands every layer the mask and decode bias it built first; layers with
    their own tables (UMT5) share the bucket indices but each get their own table's values."""
    gen = torch.Generator().manual_seed(9)
    tables = [torch.randn(4, 129, generator=gen) for _ in range(2)]
    calls = []

    def to_buckets(relative):
        calls.append(tuple(relative.shape))
        return relative.clamp(-64, 64) + 64

    buckets = StepRelativeBuckets(to_buckets)
    first, second = (StepPositionBias(buckets, lambda b, t=t: t[:, b]) for t in tables)
    lens = torch.tensor([3, 7], dtype=torch.int32)
    for step_bias, table in ((first, tables[0]), (second, tables[1])):
        def plain(relative, table=table):
            return table[:, relative.clamp(-64, 64) + 64]

        mask = step_bias.prefill_mask(5, 9, True, torch.float32, torch.device("cpu"))
        assert step_bias.prefill_mask(5, 9, True, torch.float32, torch.device("cpu")) is mask
        assert mask.is_contiguous()
        torch.testing.assert_close(mask, _reference_mask(plain, 5, 9, True), rtol=0, atol=0)
        decode = step_bias.decode_bias(lens, 7)
        assert step_bias.decode_bias(lens, 7) is decode
        torch.testing.assert_close(decode, _reference_decode_bias(plain, lens, 7), rtol=0, atol=0)
    assert calls == [(13,), (2, 7)]     # the second table reused the first one's buckets
