"""The CUDA backend's decode rows with T5's relative position bias handed to the Triton kernel as a RelativeBias
(the kernel source run by Triton's interpreter on CPU tensors), against plain attention with HF's bucket function;
what the bias mapping recognises, and what it leaves to the torch path's bias tensor."""
import types

import pytest
import torch
import transformers
from transformers.models.t5.modeling_t5 import T5Attention

from seq2seq_engine.attention.backends import torch_backend
from seq2seq_engine.attention.backends.cuda_backend import CudaAttentionBackend
from seq2seq_engine.attention.backends.relative_bias import bucketed_table
from seq2seq_engine.attention.bias import BlockDiagonalCausalMask
from seq2seq_engine.attention.position_bias import StepPositionBias, StepRelativeBuckets
from seq2seq_engine.attention.types import AttentionType
from seq2seq_engine.kernels.relative_buckets import relative_position_bucket
from seq2seq_engine.models.t5_layers import T5SelfAttention

NUM_HEADS, NUM_KV_HEADS, HEAD_SIZE, BLOCK_SIZE, NUM_BUCKETS, MAX_DISTANCE = 6, 6, 8, 4, 12, 20


def _t5_layer(seed: int = 0) -> T5SelfAttention:
    config = transformers.T5Config(d_model=48, d_kv=HEAD_SIZE, num_heads=NUM_HEADS, d_ff=32,
                                   relative_attention_num_buckets=NUM_BUCKETS,
                                   relative_attention_max_distance=MAX_DISTANCE)
    layer = T5SelfAttention(config, AttentionType.DECODER, has_bias=True)
    with torch.no_grad():
        layer.relative_attention_bias.weight.copy_(torch.randn(NUM_BUCKETS, NUM_HEADS,
                                                               generator=torch.Generator().manual_seed(seed)))
    return layer


def _step_bias(layer) -> StepPositionBias:
    return StepPositionBias(StepRelativeBuckets(layer.buckets), layer.lookup)


def _paged_case(context_lens, seed: int):
    generator = torch.Generator().manual_seed(seed)
    blocks_per_seq = max(-(-n // BLOCK_SIZE) for n in context_lens)
    num_blocks = len(context_lens) * blocks_per_seq + 3
    key_cache = torch.randn(num_blocks, BLOCK_SIZE, NUM_KV_HEADS, HEAD_SIZE, generator=generator)
    value_cache = torch.randn(num_blocks, BLOCK_SIZE, NUM_KV_HEADS, HEAD_SIZE, generator=generator)
    tables = torch.randperm(num_blocks, generator=generator)[:len(context_lens) * blocks_per_seq]
    tables = tables.view(len(context_lens), blocks_per_seq).to(torch.int32)
    query = torch.randn(len(context_lens), NUM_HEADS, HEAD_SIZE, generator=generator)
    lens = torch.tensor(context_lens, dtype=torch.int32)
    return query, (key_cache, value_cache), (tables, lens, max(context_lens))


def _reference(query, kv_cache, decode, scale, table):
    """Each sequence by itself: its keys read block by block, HF's buckets of (key - query) looked up in `table`."""
    tables, lens, _ = decode
    out = torch.zeros(query.shape, dtype=torch.float64)
    for i, length in enumerate(lens.tolist()):
        slots = [int(tables[i, t // BLOCK_SIZE]) * BLOCK_SIZE + t % BLOCK_SIZE for t in range(length)]
        keys, values = (c.flatten(0, 1)[slots].double().transpose(0, 1) for c in kv_cache)
        scores = torch.einsum("hd,htd->ht", query[i].double(), keys) * scale
        if table is not None:
            relative = torch.arange(length) - (length - 1)
            buckets = T5Attention._relative_position_bucket(relative, False, NUM_BUCKETS, MAX_DISTANCE)
            scores = scores + table.double()[buckets].t()
        out[i] = torch.einsum("ht,htd->hd", scores.softmax(-1), values)
    return out


@pytest.fixture
def triton_kernel(monkeypatch):
    """The Triton decode kernel (interpreted on CPU tensors) as the backend's, each call's relative_bias recorded."""
    triton_attention = pytest.importorskip("seq2seq_engine.kernels.triton_attention")
    if not triton_attention.triton_available("cpu"):
        pytest.skip("triton is not installed")
    biases = []

    def kernel(*args, relative_bias=None, out=None):
        biases.append(relative_bias)
        return triton_attention.paged_decode_attention(*args, relative_bias=relative_bias, out=out)

    monkeypatch.setattr(CudaAttentionBackend, "_triton", staticmethod(lambda: (kernel, triton_attention.RelativeBias)))
    return biases


def test_t5_buckets_are_hfs():
    relative = torch.arange(-300, 301)
    for bidirectional in (False, True):
        for num_buckets, max_distance in ((32, 128), (12, 20), (6, 9)):
            expected = T5Attention._relative_position_bucket(relative, bidirectional, num_buckets, max_distance)
            assert torch.equal(relative_position_bucket(relative, bidirectional, num_buckets, max_distance), expected)


def test_a_t5_layers_bias_maps_to_its_table_and_bucket_parameters():
    layer = _t5_layer()
    table = bucketed_table(_step_bias(layer))
    assert table.table is layer.relative_attention_bias.weight
    assert (table.num_buckets, table.max_distance, table.bidirectional) == (NUM_BUCKETS, MAX_DISTANCE, False)
    assert bucketed_table(layer.position_bias) is None                    # a plain function of positions
    assert bucketed_table(_step_bias(types.SimpleNamespace(buckets=layer.buckets, lookup=lambda b: b))) is None


def test_buckets_other_than_t5s_are_not_mapped():
    class ShiftedBuckets(T5SelfAttention):
        def buckets(self, relative):
            return (super().buckets(relative) + 1).clamp(max=self.num_buckets - 1)

    config = transformers.T5Config(d_model=48, d_kv=HEAD_SIZE, num_heads=NUM_HEADS, d_ff=32,
                                   relative_attention_num_buckets=NUM_BUCKETS)
    layer = ShiftedBuckets(config, AttentionType.DECODER, has_bias=True)
    assert bucketed_table(_step_bias(layer)) is None


@pytest.mark.parametrize("context_lens", [[1, 7, 30, 44], [25, 3, 3, 17, 60]])
def test_decode_with_t5s_bias_runs_in_the_kernel_and_matches_plain_attention(context_lens, triton_kernel):
    layer = _t5_layer(seed=len(context_lens))
    query, kv_cache, decode = _paged_case(context_lens, seed=3)
    out = CudaAttentionBackend("sdpa", "triton").paged_decode(query, kv_cache, decode, 0.5, _step_bias(layer))
    expected = _reference(query, kv_cache, decode, 0.5, layer.relative_attention_bias.weight.detach())
    torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=1e-5)
    relative = triton_kernel[0]
    assert relative is not None and relative.table is layer.relative_attention_bias.weight
    assert torch.equal(relative.query_positions, decode[1] - 1) and relative.query_positions.dtype == torch.int32


def test_a_bias_the_kernel_cannot_express_runs_the_torch_path_with_its_tensor(triton_kernel):
    layer = _t5_layer(seed=4)
    query, kv_cache, decode = _paged_case([5, 19, 33], seed=8)
    backend = CudaAttentionBackend("sdpa", "triton")
    out = backend.paged_decode(query, kv_cache, decode, 0.5, layer.position_bias)  # a function, not a table
    expected = _reference(query, kv_cache, decode, 0.5, layer.relative_attention_bias.weight.detach())
    torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=1e-5)
    assert triton_kernel == []
    backend.paged_decode(query, kv_cache, decode, 0.5)     # no bias: the kernel
    assert triton_kernel == [None]


def test_a_mixed_step_writes_the_kernels_decode_rows_after_the_prefill_rows(triton_kernel):
    layer = _t5_layer(seed=6)
    query, kv_cache, decode = _paged_case([9, 14], seed=12)
    generator = torch.Generator().manual_seed(1)
    prefill_q, prefill_k, prefill_v = (torch.randn(7, NUM_HEADS, HEAD_SIZE, generator=generator) for _ in range(3))
    bias = BlockDiagonalCausalMask.from_seqlens([3, 4])
    metadata = types.SimpleNamespace(num_prefills=2, num_prefill_tokens=7, num_decode_tokens=2)
    step_bias = _step_bias(layer)
    full_query = torch.cat([prefill_q, query])
    out = CudaAttentionBackend("sdpa", "triton")._prefill_and_decode(
        full_query, prefill_k, prefill_v, bias, kv_cache, decode, metadata, 0.5, step_bias)
    expected = torch_backend.TorchAttentionBackend()._prefill_and_decode(
        full_query, prefill_k, prefill_v, bias, kv_cache, decode, metadata, 0.5, _step_bias(layer))
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out[7:].double(), _reference(query, kv_cache, decode, 0.5,
                                                            layer.relative_attention_bias.weight.detach()),
                               atol=1e-5, rtol=1e-5)
    assert len(triton_kernel) == 1 and triton_kernel[0] is not None


def test_a_float8_cache_is_read_widened_by_the_kernel_and_the_prefill_gather(triton_kernel):
    """The same step over float8 caches: the kernel's decode rows and the gather a cached prefix's prefill reads
    equal plain attention and indexing over the widened values."""
    layer = _t5_layer(seed=7)
    query, kv_cache, decode = _paged_case([6, 21, 40], seed=13)
    fp8_cache = tuple((cache * 4).to(torch.float8_e4m3fn) for cache in kv_cache)
    widened = tuple(cache.float() for cache in fp8_cache)
    out = CudaAttentionBackend("sdpa", "triton").paged_decode(query, fp8_cache, decode, 0.5, _step_bias(layer))
    expected = _reference(query, widened, decode, 0.5, layer.relative_attention_bias.weight.detach())
    torch.testing.assert_close(out.double(), expected, atol=1e-4, rtol=1e-4)
    tables, _, _ = decode
    bias = BlockDiagonalCausalMask.from_seqlens([6, 21])
    gathered = torch_backend._gather_context(fp8_cache, tables[:2], bias)
    assert all(t.dtype == torch.float8_e4m3fn for t in gathered)
    for got, want in zip(gathered, torch_backend._gather_context(widened, tables[:2], bias)):
        assert torch.equal(got.float(), want)
