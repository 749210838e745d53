"""The fused decoder-layer ops (kernels/native_fused.py) against HF transformers' own Llama modules, both paths."""
import pytest
import torch
from transformers.activations import ACT2FN
from transformers.models.llama.modeling_llama import LlamaRMSNorm, apply_rotary_pos_emb

from seq2seq_engine.kernels import native, native_fused

DTYPES = [torch.float32, torch.bfloat16]


def _randn(seed, *shape, dtype=torch.float32, scale=1.0):
    return (torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale).to(dtype)


def _assert_close(actual, expected, dtype):
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    if dtype == torch.float32:
        torch.testing.assert_close(actual, expected, rtol=2e-6, atol=2e-6)
    else:  # an fp32 intermediate an ulp apart (sum order, exp) can flip a rare bfloat16 rounding, which a
        # following bfloat16 product may double: allow 2 ulps, and require nearly all elements to be equal
        torch.testing.assert_close(actual.float(), expected.float(), rtol=2 ** -6, atol=2 ** -7)
        assert (actual == expected).float().mean() > 0.99


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [1, 7, 200])  # 200 x 576 crosses the kernels' threading threshold
@pytest.mark.parametrize("with_residual", [False, True])
def test_rms_norm_matches_hf(kernel_path, dtype, rows, with_residual):
    width, eps = 576, 1e-5
    hf = LlamaRMSNorm(width, eps=eps)
    hf.weight.data = _randn(1, width, scale=0.5) + 1.0
    hf = hf.to(dtype)
    wide = _randn(2, rows, width + 40, dtype=dtype, scale=3.0)
    x = wide[:, 13:13 + width]  # a row-strided view, as a column slice of a fused projection would be
    residual = _randn(3, rows, width, dtype=dtype) if with_residual else None
    out, summed = native_fused.rms_norm(x, hf.weight.data, eps, residual)
    expected_input = residual + x if with_residual else x
    with torch.no_grad():
        _assert_close(out, hf(expected_input), dtype)
    if with_residual:
        assert torch.equal(summed, expected_input)
    else:
        assert summed is None


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens,num_heads,num_kv_heads,head_dim", [(5, 4, 4, 32), (64, 9, 3, 64), (300, 8, 1, 128)])
def test_rotary_matches_hf(kernel_path, dtype, tokens, num_heads, num_kv_heads, head_dim):
    q_size, kv_size = num_heads * head_dim, num_kv_heads * head_dim
    qkv = _randn(4, tokens, q_size + 2 * kv_size, dtype=dtype, scale=2.0)
    positions = torch.randint(0, 4000, (tokens,), generator=torch.Generator().manual_seed(5))
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, head_dim, 2).float() / head_dim))
    freqs = positions.float()[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos().to(dtype), emb.sin().to(dtype)
    q = native_fused.rotary_neox(qkv, 0, num_heads, head_dim, cos, sin)
    k = native_fused.rotary_neox(qkv, q_size, num_kv_heads, head_dim, cos, sin)
    # HF layout: [batch, heads, tokens, head_dim] with cos/sin [batch, tokens, head_dim]
    hf_q = qkv[:, :q_size].reshape(1, tokens, num_heads, head_dim).transpose(1, 2)
    hf_k = qkv[:, q_size:q_size + kv_size].reshape(1, tokens, num_kv_heads, head_dim).transpose(1, 2)
    ref_q, ref_k = apply_rotary_pos_emb(hf_q, hf_k, cos[None], sin[None])
    assert q.is_contiguous() and k.is_contiguous()
    _assert_close(q, ref_q.transpose(1, 2).reshape(tokens, q_size), dtype)
    _assert_close(k, ref_k.transpose(1, 2).reshape(tokens, kv_size), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens,width", [(1, 64), (64, 1536), (100, 1000)])
def test_silu_and_mul_matches_hf(kernel_path, dtype, tokens, width):
    gate_up = _randn(6, tokens, 2 * width, dtype=dtype, scale=4.0)
    expected = ACT2FN["silu"](gate_up[:, :width]) * gate_up[:, width:]
    _assert_close(native_fused.silu_and_mul(gate_up), expected, dtype)


@pytest.mark.parametrize("tokens,width", [(1, 64), (64, 2048), (100, 1000)])
def test_gelu_tanh_and_mul_matches_hf(kernel_path, tokens, width):
    gate_linear = _randn(11, tokens, 2 * width, scale=4.0)
    gate_linear[0, :4] = torch.tensor([-60.0, -12.0, 0.0, 60.0])     # the ends where exp would overflow
    gate, linear = gate_linear[:, :width], gate_linear[:, width:]
    expected = ACT2FN["gelu_new"](gate) * linear
    got = native_fused.gelu_tanh_and_mul(gate_linear)
    assert got.dtype == expected.dtype and got.shape == expected.shape
    # for negative gates HF's 1 + tanh(u) cancels: its rounding (an ulp of 1, times 0.5 * gate * linear) is the
    # bound there; elsewhere a few ulps of the result
    bound = 2e-6 * expected.abs() + 4 * torch.finfo(torch.float32).eps * (0.5 * gate * linear).abs()
    assert ((got - expected).abs() <= bound).all()
    bf16 = gate_linear.to(torch.bfloat16)   # other dtypes: HF's op-by-op formula and rounding
    expected_bf16 = ACT2FN["gelu_new"](bf16[:, :width]) * bf16[:, width:]
    assert torch.equal(native_fused.gelu_tanh_and_mul(bf16), expected_bf16)
    with pytest.raises(ValueError, match="last dimension \\(7\\) must hold gate and linear halves"):
        native_fused.gelu_tanh_and_mul(gate_linear[:, :7])


def test_unsupported_inputs_take_the_torch_path(monkeypatch):
    """float16, a non-contiguous gate_up and mixed dtypes still give HF's result (the torch path runs)."""
    monkeypatch.setenv(native.NATIVE_ENV, "1")
    native.load_library.cache_clear()
    gate_up = _randn(7, 16, 2 * 48, dtype=torch.float16)
    expected = ACT2FN["silu"](gate_up[:, :48]) * gate_up[:, 48:]
    torch.testing.assert_close(native_fused.silu_and_mul(gate_up), expected)
    strided = _randn(8, 2 * 48, 16).t()
    torch.testing.assert_close(native_fused.silu_and_mul(strided),
                               ACT2FN["silu"](strided[:, :48]) * strided[:, 48:])
    x, weight = _randn(9, 4, 32), _randn(10, 32, dtype=torch.bfloat16)
    out, _ = native_fused.rms_norm(x, weight, 1e-6)
    hf = LlamaRMSNorm(32, eps=1e-6)
    hf.weight.data = weight
    with torch.no_grad():
        torch.testing.assert_close(out, hf(x))
    native.load_library.cache_clear()


def test_native_rms_norm_propagates_nan_per_row(monkeypatch):
    """A NaN in one row poisons that row only (no cross-row state in the kernel)."""
    monkeypatch.setenv(native.NATIVE_ENV, "1")
    native.load_library.cache_clear()
    x = _randn(11, 3, 64)
    x[1, 5] = float("nan")
    out, _ = native_fused.rms_norm(x, torch.ones(64), 1e-6)
    assert torch.isnan(out[1]).all() and torch.isfinite(out[[0, 2]]).all()
    native.load_library.cache_clear()


def test_mismatched_shapes_raise_value_error(kernel_path):
    x = _randn(12, 4, 64)
    with pytest.raises(ValueError, match="residual shape"):
        native_fused.rms_norm(x, torch.ones(64), 1e-6, _randn(13, 3, 64))
    with pytest.raises(ValueError, match="weight shape"):
        native_fused.rms_norm(x, torch.ones(32), 1e-6)
    with pytest.raises(ValueError, match="gate and up halves"):
        native_fused.silu_and_mul(_randn(15, 4, 63))
    cos = sin = _randn(14, 4, 16)
    with pytest.raises(ValueError, match="need input columns"):
        native_fused.rotary_neox(x, 32, 3, 16, cos, sin)  # columns 32..80 of a 64-wide input
    with pytest.raises(ValueError, match="cos/sin"):
        native_fused.rotary_neox(x, 0, 2, 16, cos[:3], sin[:3])
