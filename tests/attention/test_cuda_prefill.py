"""The CUDA backend's prefill against plain per-block attention (float64, K/V heads repeated): torch SDPA over runs of
equal-shape blocks with grouped heads (enable_gqa), on CPU tensors; xformers' 5-D grouped form, its layout checked on
the CPU through a stand-in for xformers' kernel and its kernel run where CUDA is."""
import pytest
import torch

from seq2seq_engine.attention.backends import torch_backend, xformers_backend
from seq2seq_engine.attention.backends.cuda_backend import CudaAttentionBackend
from seq2seq_engine.attention.bias import (BlockDiagonalCausalFromBottomRightMask, BlockDiagonalCausalMask,
                                           BlockDiagonalMask)

HEAD_SIZE = 16
Q_LENS = [3, 3, 5, 1, 1, 7, 2]
CONTEXT = [0, 0, 4, 2, 2, 1, 6]   # extra keys per block: cached context (bottom-right) or a longer encoder (cross)


def _bias(kind: str):
    if kind == "encoder":
        return BlockDiagonalMask.from_seqlens(Q_LENS)
    if kind == "causal":
        return BlockDiagonalCausalMask.from_seqlens(Q_LENS)
    k_lens = [q + extra for q, extra in zip(Q_LENS, CONTEXT)]
    if kind == "bottom_right":
        return BlockDiagonalCausalFromBottomRightMask.from_seqlens(Q_LENS, k_lens)
    return BlockDiagonalMask.from_seqlens(Q_LENS, k_lens)  # cross: rectangular, non-causal


def _inputs(bias, num_heads: int, num_kv_heads: int, seed: int, device="cpu", dtype=torch.float32):
    generator = torch.Generator().manual_seed(seed)
    num_q, num_k = bias.q_seqinfo.seqstart_py[-1], bias.k_seqinfo.seqstart_py[-1]
    query = torch.randn(num_q, num_heads, HEAD_SIZE, generator=generator)
    key = torch.randn(num_k, num_kv_heads, HEAD_SIZE, generator=generator)
    value = torch.randn(num_k, num_kv_heads, HEAD_SIZE, generator=generator)
    return [t.to(device=device, dtype=dtype) for t in (query, key, value)]


def _reference(query, key, value, bias, scale):
    """Each block by itself in float64: scores plus the 0/-inf mask of its kind, softmax, weighted values."""
    group = query.shape[1] // key.shape[1]
    key, value = (t.double().repeat_interleave(group, dim=1) for t in (key, value))
    out = torch.empty(query.shape, dtype=torch.float64)
    q_starts, k_starts = bias.q_seqinfo.seqstart_py, bias.k_seqinfo.seqstart_py
    for i in range(len(q_starts) - 1):
        q = query[q_starts[i]:q_starts[i + 1]].double().transpose(0, 1)
        k = key[k_starts[i]:k_starts[i + 1]].transpose(0, 1)
        v = value[k_starts[i]:k_starts[i + 1]].transpose(0, 1)
        scores = q @ k.transpose(1, 2) * scale
        if bias.causal:
            q_len, k_len = q.shape[1], k.shape[1]
            shift = k_len - q_len if bias.bottom_right else 0
            future = torch.ones(q_len, k_len, dtype=torch.bool).triu(shift + 1)
            scores = scores.masked_fill(future, float("-inf"))
        out[q_starts[i]:q_starts[i + 1]] = (scores.softmax(-1) @ v).transpose(0, 1)
    return out


def _runs(bias) -> int:
    return len(torch_backend._runs_of_equal_shape(bias))


@pytest.mark.parametrize("kind", ["encoder", "causal", "bottom_right", "cross"])
@pytest.mark.parametrize("num_heads, num_kv_heads", [(9, 3), (4, 4), (6, 1)])
def test_sdpa_prefill_matches_plain_attention_in_one_call_per_run_of_equal_blocks(
        kind, num_heads, num_kv_heads, monkeypatch):
    bias = _bias(kind)
    query, key, value = _inputs(bias, num_heads, num_kv_heads, seed=num_heads + len(kind))
    calls = []
    sdpa = torch_backend.F.scaled_dot_product_attention

    def counted(q, k, v, **kwargs):
        calls.append((tuple(q.shape), tuple(k.shape), kwargs["enable_gqa"]))
        return sdpa(q, k, v, **kwargs)

    monkeypatch.setattr(torch_backend.F, "scaled_dot_product_attention", counted)
    out = CudaAttentionBackend("sdpa").prefill_attention(query, key, value, bias, 0.37)
    torch.testing.assert_close(out.double(), _reference(query, key, value, bias, 0.37), atol=1e-5, rtol=1e-5)
    assert len(calls) == _runs(bias) < len(Q_LENS)          # blocks of equal shape batched into one call
    # grouped heads go in as they are: K/V keep num_kv_heads heads, enable_gqa set exactly when grouped
    assert all(k_shape[1] == num_kv_heads and gqa == (num_heads != num_kv_heads) for _, k_shape, gqa in calls)


def test_the_xformers_choice_hands_a_biased_prefill_to_sdpa_with_its_float_mask(monkeypatch):
    bias = _bias("causal")
    query, key, value = _inputs(bias, 4, 2, seed=5)
    monkeypatch.setattr(xformers_backend, "xformers_prefill", lambda *args: pytest.fail("xformers got a bias"))

    def position_bias(relative):  # a per-head linear bias of the distance
        return relative.to(torch.float32)[None] * torch.tensor([0.1, -0.2, 0.3, 0.05]).view(4, *([1] * relative.dim()))

    out = CudaAttentionBackend("xformers").prefill_attention(query, key, value, bias, 0.5, position_bias)
    expected = torch_backend.varlen_attention(query, key, value, bias, 0.5, position_bias)
    torch.testing.assert_close(out, expected)


def _xformers_or_skip():
    try:
        return xformers_backend._xformers_attn_bias()
    except Exception as error:  # not installed, or an install that does not import here
        pytest.skip(f"xformers does not import: {error}")


def _stand_in_kernel(seen):
    """xformers' memory_efficient_attention_forward on the CPU: BMHK or BMGHK inputs, xformers' bias materialized."""
    def forward(query, key, value, attn_bias, scale):
        seen.append((query, key, value, attn_bias))
        if query.dim() == 4:
            query, key, value = (t.unsqueeze(3) for t in (query, key, value))
        _, num_q, groups, per_group, head_size = query.shape
        mask = attn_bias.materialize((num_q, key.shape[1]), dtype=torch.float64)
        scores = torch.einsum("qghd,kghd->ghqk", query[0].double(), key[0].double()) * scale + mask
        out = torch.einsum("ghqk,kghd->qghd", scores.softmax(-1), value[0].double())
        return out.to(query.dtype).reshape(1, num_q, groups, per_group, head_size)
    return forward


@pytest.mark.parametrize("kind", ["encoder", "causal", "bottom_right", "cross"])
@pytest.mark.parametrize("num_heads, num_kv_heads", [(9, 3), (4, 4)])
def test_xformers_prefill_passes_grouped_heads_as_expanded_views(kind, num_heads, num_kv_heads, monkeypatch):
    _xformers_or_skip()
    from xformers.ops import fmha
    seen = []
    monkeypatch.setattr(fmha, "memory_efficient_attention_forward", _stand_in_kernel(seen))
    bias = _bias(kind)
    query, key, value = _inputs(bias, num_heads, num_kv_heads, seed=11)
    out = xformers_backend.xformers_prefill(query, key, value, bias, 0.3)
    torch.testing.assert_close(out.double(), _reference(query, key, value, bias, 0.3), atol=1e-5, rtol=1e-5)
    q5, k5, v5, xformers_bias = seen[0]
    assert type(xformers_bias).__name__ == type(bias).__name__
    if num_heads != num_kv_heads:
        group = num_heads // num_kv_heads
        assert q5.shape == (1, query.shape[0], num_kv_heads, group, HEAD_SIZE) and q5.data_ptr() == query.data_ptr()
        for grouped, flat in ((k5, key), (v5, value)):   # a view of the caller's K/V: no copy, stride 0 over the group
            assert grouped.shape == (1, key.shape[0], num_kv_heads, group, HEAD_SIZE)
            assert grouped.stride(3) == 0 and grouped.data_ptr() == flat.data_ptr()


def test_xformers_prefill_steps_aside_for_sdpa_where_xformers_has_no_kernel(monkeypatch):
    _xformers_or_skip()
    from xformers.ops import fmha

    def no_kernel(*args, **kwargs):
        raise NotImplementedError("No operator found for `memory_efficient_attention_forward` with inputs")

    monkeypatch.setattr(fmha, "memory_efficient_attention_forward", no_kernel)
    bias = _bias("causal")
    query, key, value = _inputs(bias, 9, 3, seed=2)
    assert xformers_backend.xformers_prefill(query, key, value, bias, 0.25) is None
    out = CudaAttentionBackend("xformers").prefill_attention(query, key, value, bias, 0.25)
    torch.testing.assert_close(out.double(), _reference(query, key, value, bias, 0.25), atol=1e-5, rtol=1e-5)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("prefill", ["sdpa", "xformers"])
@pytest.mark.parametrize("kind", ["encoder", "causal", "bottom_right", "cross"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_prefill_on_the_gpu_matches_plain_attention(prefill, kind, dtype):
    if prefill == "xformers":
        _xformers_or_skip()
    bias = _bias(kind)
    query, key, value = _inputs(bias, 9, 3, seed=7, device="cuda", dtype=dtype)
    out = CudaAttentionBackend(prefill).prefill_attention(query, key, value, bias, 0.25)
    expected = _reference(query.cpu(), key.cpu(), value.cpu(), bias, 0.25)
    tolerance = 1e-3 if dtype == torch.float32 else 3e-2    # TF32 / bfloat16 rounding
    torch.testing.assert_close(out.cpu().double(), expected, atol=tolerance, rtol=tolerance)
