"""A float8 e4m3 KV cache: writes round like torch's cast and saturate at +-448 instead of overflowing; the Triton paged
decode kernel and the torch path read it widened, matching a float64 reference over the same float8 values (self,
GQA, cross over 1,500 encoder positions, T5's bias, split-K); block copies and swaps move it byte for byte. CPU
tensors run the Triton kernels' source through Triton's interpreter; on a CUDA machine they also run compiled."""
import math

import pytest
import torch
from test_triton_attention import make_bias, make_paged, reference

from seq2seq_engine.kernels import copy_blocks, paged_attention, reshape_and_cache, swap_blocks
from seq2seq_engine.kernels.triton_attention import paged_decode_attention
from seq2seq_engine.kernels.triton_cache import copy_paged_blocks, write_to_paged_cache

FP8 = torch.float8_e4m3fn
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
# the float64 reference reads the same float8 values, so only the output's rounding and float32 sums differ
TOLERANCE = {torch.float32: 2e-5, torch.bfloat16: 1.6e-2, torch.float16: 2e-3}


def fp8_case(device, lens, num_heads, num_kv_heads, head_size, query_dtype, seed, bias_spec=None, **overrides):
    """The Triton kernel over float8 caches against the reference over the same values."""
    gen = torch.Generator().manual_seed(seed)
    key_cache, value_cache, tables = make_paged(gen, lens, 16, num_kv_heads, head_size, torch.float32, device)
    # spread the values over float8's range (up to ~100), NaN kept in the unused slots
    key_cache, value_cache = (key_cache * 30).to(FP8), (value_cache * 30).to(FP8)
    query = torch.randn(len(lens), num_heads, head_size, generator=gen).to(device, query_dtype) / 30
    context_lens = torch.tensor(lens, dtype=torch.int32, device=device)
    scale, bias, ref_bias = 1.0 / math.sqrt(head_size), None, None
    if bias_spec is not None:
        scale = 1.0
        bias, ref_bias = make_bias(gen, bias_spec, lens, num_heads, query_dtype, device)
    out = paged_decode_attention(query, key_cache, value_cache, tables, context_lens, scale, relative_bias=bias,
                                 **overrides)
    expected = reference(query, key_cache.float(), value_cache.float(), tables, lens, scale, ref_bias)
    assert out.dtype == query_dtype and torch.isfinite(out).all()
    torch.testing.assert_close(out.cpu().double(), expected, atol=TOLERANCE[query_dtype] * 30, rtol=0)
    return out, (query, key_cache, value_cache, tables, context_lens, scale)


@pytest.mark.gpu_kernel
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("num_heads,num_kv_heads,head_size,query_dtype", [
    (12, 12, 64, torch.bfloat16), (9, 3, 80, torch.float32), (20, 20, 128, torch.float16)])
def test_triton_decode_reads_a_float8_cache(device, num_heads, num_kv_heads, head_size, query_dtype):
    out, _ = fp8_case(device, [0, 1, 17, 48], num_heads, num_kv_heads, head_size, query_dtype, seed=0)
    assert out[0].abs().max() == 0


@pytest.mark.gpu_kernel
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("num_splits", [1, 4])
def test_triton_cross_attention_over_a_float8_cache_with_and_without_splits(device, num_splits):
    fp8_case(device, [1, 1500, 333], 20, 20, 64, torch.bfloat16, seed=1, num_splits=num_splits)


@pytest.mark.gpu_kernel
@pytest.mark.parametrize("device", DEVICES)
def test_triton_t5_bias_over_a_float8_cache(device):
    fp8_case(device, [0, 5, 130, 300], 9, 3, 64, torch.float32, seed=2, bias_spec=(False, 32, 128))


def test_torch_path_reads_a_float8_cache_like_the_triton_kernel():
    """kernels.paged_attention on CPU tensors (the torch path a GPU without Triton runs) against the same reference."""
    out, (query, key_cache, value_cache, tables, lens, scale) = fp8_case("cpu", [3, 40, 77], 8, 2, 64,
                                                                         torch.float32, seed=3)
    torch_out = paged_attention(query, key_cache, value_cache, tables, lens, scale)
    torch.testing.assert_close(torch_out, out, atol=1e-4, rtol=0)


def _write_inputs(device):
    gen = torch.Generator().manual_seed(4)
    num_blocks, block_size, num_kv_heads, head_size = 5, 16, 2, 64
    cache_shape = (num_blocks, block_size, num_kv_heads, head_size)
    key_cache = torch.zeros(cache_shape, dtype=FP8, device=device)
    value_cache = torch.zeros(cache_shape, dtype=FP8, device=device)
    # a quarter of the values beyond float8's largest (448), both signs
    key = (torch.randn(6, num_kv_heads, head_size, generator=gen) * 400).to(device, torch.bfloat16)
    value = (torch.randn(6, num_kv_heads, head_size, generator=gen) * 400).to(device, torch.bfloat16)
    slots = torch.tensor([70, 3, -1, 16, 79, 40], device=device)
    return key, value, key_cache, value_cache, slots


def _expected_fp8(tokens: torch.Tensor) -> torch.Tensor:
    """In range: torch's own cast; beyond: the largest float8 value of that sign."""
    widened = tokens.float()
    cast = widened.to(FP8).float()
    return torch.where(widened.abs() > 448, widened.sign() * 448, cast)


@pytest.mark.parametrize("writer", ["triton", "torch"])
def test_float8_writes_round_like_torch_and_saturate(writer):
    key, value, key_cache, value_cache, slots = _write_inputs("cpu")
    assert (key.float().abs() > 448).float().mean() > 0.1
    write = write_to_paged_cache if writer == "triton" else reshape_and_cache
    write(key, value, key_cache, value_cache, slots)
    block_size = key_cache.shape[1]
    for token, slot in enumerate(slots.tolist()):
        if slot < 0:
            continue
        for cache, tokens in ((key_cache, key), (value_cache, value)):
            stored = cache[slot // block_size, slot % block_size].float()
            assert torch.equal(stored, _expected_fp8(tokens[token])), (writer, token)
    written = {s // block_size * block_size + s % block_size for s in slots.tolist() if s >= 0}
    untouched = [s for s in range(key_cache.shape[0] * block_size) if s not in written]
    assert key_cache.view(-1, *key_cache.shape[2:]).float()[untouched].abs().max() == 0


@pytest.mark.parametrize("copier", ["triton", "torch"])
def test_float8_block_copies_and_swaps_move_the_bytes(copier):
    gen = torch.Generator().manual_seed(5)
    shape = (6, 16, 2, 64)
    key_caches = [(torch.randn(shape, generator=gen) * 50).to(FP8) for _ in range(2)]
    value_caches = [(torch.randn(shape, generator=gen) * 50).to(FP8) for _ in range(2)]
    before = [cache.view(torch.uint8).clone() for cache in key_caches + value_caches]
    mapping = torch.tensor([[0, 2], [2, 5], [4, 1]])
    (copy_paged_blocks if copier == "triton" else copy_blocks)(key_caches, value_caches, mapping)
    for cache, old in zip(key_caches + value_caches, before):
        want = old.clone()
        for src, dst in mapping.tolist():
            want[dst] = old[src]
        assert torch.equal(cache.view(torch.uint8), want)
    pool = torch.zeros((3, *shape[1:]), dtype=FP8)
    swap_blocks(key_caches[0], pool, torch.tensor([[5, 0], [1, 2]]))
    assert torch.equal(pool.view(torch.uint8)[[0, 2]], key_caches[0].view(torch.uint8)[[5, 1]])
    assert pool.view(torch.uint8)[1].max() == 0
