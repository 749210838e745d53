"""The Triton paged decode attention against a float64 plain-torch reference on random inputs: MHA and GQA, head sizes
64/80/128, shuffled block tables with garbage past each context, NaN in unused cache slots, empty and block-multiple
contexts, cross-attention over encoder lengths up to 1,500, T5's relative position bias (HF's bucket function) and
float32/bfloat16/float16. CPU tensors run the kernels' source through Triton's interpreter; on a CUDA machine the
same cases also run compiled on the GPU."""
import math

import pytest
import torch
from transformers.models.t5.modeling_t5 import T5Attention

from seq2seq_engine.kernels.triton_attention import RelativeBias, bucket_lut, paged_decode_attention

pytestmark = pytest.mark.gpu_kernel
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
# absolute tolerance against the float64 reference: the output's rounding (Triton's interpreter truncates to
# bfloat16 where the GPU rounds) plus float32 accumulation
TOLERANCE = {torch.float32: 2e-5, torch.bfloat16: 1.6e-2, torch.float16: 2e-3}


def make_paged(gen, lens, block_size, num_kv_heads, head_size, dtype, device):
    """Random K/V scattered into shuffled blocks (NaN in every slot no context uses), and int32 block tables whose
    entries past each context are garbage (-1 or ids far outside the cache)."""
    width = max([math.ceil(n / block_size) for n in lens] + [1]) + 2
    num_blocks = sum(math.ceil(n / block_size) for n in lens) + 3
    shape = (num_blocks, block_size, num_kv_heads, head_size)
    key_cache, value_cache = torch.full(shape, float("nan")), torch.full(shape, float("nan"))
    order = torch.randperm(num_blocks, generator=gen).tolist()
    tables = torch.randint(10 ** 6, 10 ** 7, (len(lens), width), generator=gen, dtype=torch.int32)
    tables[:, -1] = -1
    for seq, n in enumerate(lens):
        used = math.ceil(n / block_size)
        tables[seq, :used] = torch.tensor([order.pop() for _ in range(used)], dtype=torch.int32)
        for pos in range(n):
            block, offset = int(tables[seq, pos // block_size]), pos % block_size
            key_cache[block, offset] = torch.randn(num_kv_heads, head_size, generator=gen)
            value_cache[block, offset] = torch.randn(num_kv_heads, head_size, generator=gen)
    return key_cache.to(device, dtype), value_cache.to(device, dtype), tables.to(device)


def reference(query, key_cache, value_cache, tables, lens, scale, bias=None):
    """One float64 softmax per sequence and head over the context gathered position by position; ``bias`` is
    (table [num_buckets, num_heads], query positions, bucket function of relative positions)."""
    num_seqs, num_heads, head_size = query.shape
    block_size, group = key_cache.shape[1], num_heads // key_cache.shape[2]
    out = torch.zeros(num_seqs, num_heads, head_size, dtype=torch.float64)
    for seq, n in enumerate(lens):
        if n == 0:
            continue
        rows = [(int(tables[seq, pos // block_size]), pos % block_size) for pos in range(n)]
        keys = torch.stack([key_cache[b, o] for b, o in rows]).cpu().double()
        values = torch.stack([value_cache[b, o] for b, o in rows]).cpu().double()
        for head in range(num_heads):
            scores = keys[:, head // group] @ query[seq, head].cpu().double() * scale
            if bias is not None:
                table, positions, to_buckets = bias
                scores += table[to_buckets(torch.arange(n) - int(positions[seq])), head].cpu().double()
            out[seq, head] = torch.softmax(scores, dim=0) @ values[:, head // group]
    return out


def run_case(device, lens, num_heads, num_kv_heads, head_size, dtype, block_size=16, seed=0, bias_spec=None,
             width=None, **overrides):
    """The kernel against the reference on random inputs; ``width`` sets the block tables' width, ``overrides`` are
    the kernel's tuning keywords."""
    gen = torch.Generator().manual_seed(seed)
    key_cache, value_cache, tables = make_paged(gen, lens, block_size, num_kv_heads, head_size, dtype, device)
    if width is not None:  # a table of exactly ``width`` blocks, garbage past every context
        extra = torch.randint(10 ** 6, 10 ** 7, (len(lens), max(0, width - tables.shape[1])), generator=gen)
        tables = torch.cat([tables, extra.to(device, torch.int32)], dim=1)[:, :width].contiguous()
    query = torch.randn(len(lens), num_heads, head_size, generator=gen).to(device, dtype)
    context_lens = torch.tensor(lens, dtype=torch.int32, device=device)
    scale, bias, ref_bias = 1.0 / math.sqrt(head_size), None, None
    if bias_spec is not None:
        scale = 1.0  # as T5
        bias, ref_bias = make_bias(gen, bias_spec, lens, num_heads, dtype, device)
    out = paged_decode_attention(query, key_cache, value_cache, tables, context_lens, scale, relative_bias=bias,
                                 **overrides)
    expected = reference(query, key_cache, value_cache, tables, lens, scale, ref_bias)
    assert out.dtype == dtype and out.shape == query.shape and out.device.type == device
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.cpu().double(), expected, atol=TOLERANCE[dtype], rtol=0)
    return out


def make_bias(gen, spec, lens, num_heads, dtype, device):
    """A RelativeBias with a random table and the reference's (table, positions, HF bucket function)."""
    bidirectional, num_buckets, max_distance = spec
    table = (torch.randn(num_buckets, num_heads, generator=gen) * 2).to(device, dtype)
    if bidirectional:  # any query position, keys on both sides
        positions = torch.tensor([int(torch.randint(0, n + 40, (), generator=gen)) for n in lens], dtype=torch.int32)
    else:  # decoder self-attention: the query is the context's last position
        positions = torch.tensor([max(n - 1, 0) for n in lens], dtype=torch.int32)

    def to_buckets(relative):
        return T5Attention._relative_position_bucket(relative, bidirectional, num_buckets, max_distance)

    bias = RelativeBias(table, positions.to(device), num_buckets, max_distance, bidirectional)
    return bias, (table, positions, to_buckets)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("num_heads,num_kv_heads,head_size,dtype", [
    (1, 1, 64, torch.float32), (12, 12, 64, torch.bfloat16), (20, 20, 80, torch.float16),
    (9, 3, 128, torch.float32), (9, 3, 80, torch.bfloat16), (12, 1, 64, torch.float16)])
def test_self_attention_matches_reference(device, num_heads, num_kv_heads, head_size, dtype):
    out = run_case(device, [0, 1, 16, 37, 48], num_heads, num_kv_heads, head_size, dtype)
    assert out[0].abs().max() == 0  # a zero context gives zeros


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("block_size,dtype", [(8, torch.float32), (32, torch.bfloat16), (1, torch.float32)])
def test_other_block_sizes(device, block_size, dtype):
    run_case(device, [3, 64, 70], 4, 2, 64, dtype, block_size=block_size, seed=1)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("num_heads,head_size,dtype", [(12, 64, torch.bfloat16), (20, 64, torch.float32)])
def test_cross_attention_over_long_encoder_outputs(device, num_heads, head_size, dtype):
    run_case(device, [1, 1500, 333], num_heads, num_heads, head_size, dtype, seed=2)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("num_heads,num_kv_heads,dtype", [(12, 12, torch.float32), (9, 3, torch.bfloat16)])
def test_t5_relative_bias_matches_hf_buckets(device, bidirectional, num_heads, num_kv_heads, dtype):
    lens = [0, 5, 130, 300]  # past max_distance, so the logarithmic and the clamped buckets are used
    run_case(device, lens, num_heads, num_kv_heads, 64, dtype, seed=3, bias_spec=(bidirectional, 32, 128))


@pytest.mark.parametrize("num_buckets,max_distance", [(32, 128), (64, 256), (16, 20), (8, 9)])
@pytest.mark.parametrize("bidirectional", [False, True])
def test_bucket_table_is_hf_bucket_of_the_clamped_position(num_buckets, max_distance, bidirectional):
    relative = torch.arange(-3000, 3000)
    lut = bucket_lut(num_buckets, max_distance, bidirectional, torch.device("cpu"))
    ours = lut[relative.clamp(-max_distance, max_distance) + max_distance].long()
    assert torch.equal(ours, T5Attention._relative_position_bucket(relative, bidirectional, num_buckets, max_distance))


@pytest.mark.parametrize("device", DEVICES)
def test_writes_into_the_given_out_and_all_empty_contexts_give_zeros(device):
    gen = torch.Generator().manual_seed(4)
    key_cache, value_cache, tables = make_paged(gen, [0, 0], 16, 2, 64, torch.float32, device)
    query = torch.randn(2, 4, 64, generator=gen).to(device)
    out = torch.full_like(query, float("nan"))
    lens = torch.zeros(2, dtype=torch.int32, device=device)
    result = paged_decode_attention(query, key_cache, value_cache, tables, lens, 0.125, out=out)
    assert result is out and torch.equal(out, torch.zeros_like(out))


def test_bad_inputs_name_the_field():
    gen = torch.Generator().manual_seed(5)
    key_cache, value_cache, tables = make_paged(gen, [20], 16, 2, 64, torch.float32, "cpu")
    query, lens = torch.randn(1, 4, 64, generator=gen), torch.tensor([20], dtype=torch.int32)
    with pytest.raises(ValueError, match="query heads"):
        paged_decode_attention(torch.randn(1, 3, 64), key_cache, value_cache, tables, lens, 1.0)
    with pytest.raises(TypeError, match="key_cache dtype"):
        paged_decode_attention(query, key_cache.double(), value_cache.double(), tables, lens, 1.0)
    with pytest.raises(ValueError, match="context_lens: 100 tokens exceed"):
        paged_decode_attention(query, key_cache, value_cache, tables, torch.tensor([100], dtype=torch.int32), 1.0)
    with pytest.raises(ValueError, match="out must be"):
        paged_decode_attention(query, key_cache, value_cache, tables, lens, 1.0, out=torch.empty(1, 4, 32))
    bias = RelativeBias(torch.randn(32, 3), torch.tensor([19], dtype=torch.int32), 32, 128, False)
    with pytest.raises(ValueError, match=r"relative_bias.table must be \[num_buckets=32, num_heads=4\]"):
        paged_decode_attention(query, key_cache, value_cache, tables, lens, 1.0, relative_bias=bias)
    with pytest.raises(ValueError, match="max_distance"):
        bucket_lut(32, 8, True, torch.device("cpu"))
