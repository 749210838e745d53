"""Tests for the paged KV-cache kernels against loop references and dense attention."""
import math
import re

import pytest
import torch
import torch.nn.functional as F
from kernel_reference import ref_copy_blocks, ref_paged_attention, ref_reshape_and_cache, ref_swap_blocks

from seq2seq_engine.kernels import (copy_blocks, decode_attention, native, paged_attention, reshape_and_cache,
                                    swap_blocks)

HEAD_CONFIGS = [(4, 4), (9, 3), (8, 1)]  # (num_heads, num_kv_heads): MHA, GQA, MQA


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _randn(gen, *shape, dtype=torch.float32):
    return torch.randn(*shape, generator=gen).to(dtype)


def _lens_for(block_size: int) -> list:
    """Ragged lengths: 1, block boundaries on both sides, a zero row and a longer one."""
    return [1, block_size, block_size + 1, 0, 2 * block_size - 1, 3 * block_size + 5, 37]


def _build_paged(gen, lens, block_size, num_kv_heads, head_size, dtype, table_pad=0):
    """Scatter per-sequence K/V into shuffled blocks; unused cache memory is NaN. Returns caches, tables, K/V."""
    blocks_per_seq = [math.ceil(n / block_size) for n in lens]
    width = max(max(blocks_per_seq), 1) + 2
    num_blocks = sum(blocks_per_seq) + 5
    shape = (num_blocks, block_size, num_kv_heads, head_size)
    key_cache = torch.full(shape, float("nan"), dtype=dtype)
    value_cache = torch.full(shape, float("nan"), dtype=dtype)
    order = torch.randperm(num_blocks, generator=gen).tolist()
    tables = torch.full((len(lens), width), table_pad, dtype=torch.int32)
    keys, values = [], []
    for seq, (n, nblocks) in enumerate(zip(lens, blocks_per_seq)):
        tables[seq, :nblocks] = torch.tensor([order.pop() for _ in range(nblocks)], dtype=torch.int32)
        keys.append(_randn(gen, n, num_kv_heads, head_size, dtype=dtype))
        values.append(_randn(gen, n, num_kv_heads, head_size, dtype=dtype))
        for pos in range(n):
            block, offset = int(tables[seq, pos // block_size]), pos % block_size
            key_cache[block, offset] = keys[-1][pos]
            value_cache[block, offset] = values[-1][pos]
    return key_cache, value_cache, tables, keys, values


def _dense_sdpa(query, keys, values, lens, scale):
    """Batched SDPA over zero-padded contiguous K/V with a materialised padding mask (rows with len 0 excluded)."""
    num_seqs, num_heads, head_size = query.shape
    group = num_heads // keys[0].shape[1]
    max_len = max(lens)
    k = torch.randn(num_seqs, max_len, num_heads, head_size)  # finite padding garbage, masked out
    v = torch.randn(num_seqs, max_len, num_heads, head_size)
    for seq, n in enumerate(lens):
        k[seq, :n] = keys[seq].float().repeat_interleave(group, dim=1)
        v[seq, :n] = values[seq].float().repeat_interleave(group, dim=1)
    mask = (torch.arange(max_len)[None, :] < torch.tensor(lens)[:, None]).view(num_seqs, 1, 1, max_len)
    out = F.scaled_dot_product_attention(
        query.float().unsqueeze(2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask, scale=scale
    )
    return out.squeeze(2)


@pytest.mark.parametrize("num_heads,num_kv_heads", HEAD_CONFIGS)
@pytest.mark.parametrize("head_size", [40, 64, 80, 128])
@pytest.mark.parametrize("block_size", [1, 8, 16, 32])
def test_paged_attention_float32(block_size, head_size, num_heads, num_kv_heads, kernel_path):
    gen = _gen(block_size * 1000 + head_size * 10 + num_heads)
    lens = _lens_for(block_size)
    kc, vc, tables, keys, values = _build_paged(gen, lens, block_size, num_kv_heads, head_size, torch.float32)
    query = _randn(gen, len(lens), num_heads, head_size)
    scale = head_size**-0.5
    context_lens = torch.tensor(lens, dtype=torch.int32)
    out = paged_attention(query, kc, vc, tables, context_lens, scale)
    assert out.shape == query.shape and out.dtype == torch.float32
    assert torch.isfinite(out).all()
    expected = ref_paged_attention(query, kc, vc, tables, context_lens, scale)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    live = [i for i, n in enumerate(lens) if n > 0]
    dense = _dense_sdpa(query, keys, values, lens, scale)
    torch.testing.assert_close(out[live], dense[live], atol=1e-5, rtol=1e-5)
    assert torch.count_nonzero(out[lens.index(0)]) == 0


@pytest.mark.parametrize("num_heads,num_kv_heads", HEAD_CONFIGS)
@pytest.mark.parametrize("block_size,head_size", [(1, 64), (16, 80), (32, 128), (8, 40)])
def test_paged_attention_bfloat16(block_size, head_size, num_heads, num_kv_heads, kernel_path):
    gen = _gen(7 + block_size + head_size + num_heads)
    lens = _lens_for(block_size)
    kc, vc, tables, keys, values = _build_paged(gen, lens, block_size, num_kv_heads, head_size, torch.bfloat16)
    query = _randn(gen, len(lens), num_heads, head_size, dtype=torch.bfloat16)
    scale = head_size**-0.5
    context_lens = torch.tensor(lens)
    out = paged_attention(query, kc, vc, tables, context_lens, scale)
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()
    # float32 reference on the same (bf16-representable) values: only output rounding differs
    expected = ref_paged_attention(query.float(), kc.float(), vc.float(), tables, context_lens, scale)
    torch.testing.assert_close(out.float(), expected, atol=2e-2, rtol=2e-2)
    live = [i for i, n in enumerate(lens) if n > 0]
    dense = _dense_sdpa(query, keys, values, lens, scale)
    torch.testing.assert_close(out.float()[live], dense[live], atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("dtype,tolerance", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_paged_attention_runs_larger_than_the_l2(dtype, tolerance):
    """Runs whose V rows pass a quarter of any L2 up to 16 MB (4 KB rows x 1,100+ positions: 4.4 MB), where the
    native kernel stops fetching float32 V rows during the scores, beside short runs that it still fetches them
    for."""
    gen = _gen(23)
    lens = [1_100, 3, 1_400, 40]
    kc, vc, tables, _, _ = _build_paged(gen, lens, 16, 16, 64, dtype)
    query = _randn(gen, len(lens), 16, 64, dtype=dtype)
    context_lens = torch.tensor(lens, dtype=torch.int32)
    out = paged_attention(query, kc, vc, tables, context_lens, 0.125)
    expected = ref_paged_attention(query.float(), kc.float(), vc.float(), tables, context_lens, 0.125)
    torch.testing.assert_close(out.float(), expected, atol=tolerance, rtol=tolerance)


@pytest.mark.parametrize("dtype,tolerance", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("num_heads,num_kv_heads,head_size", [(12, 1, 768), (13, 1, 260), (12, 2, 256), (7, 1, 300)])
def test_paged_attention_long_heads_shared_by_many_rows(num_heads, num_kv_heads, head_size, dtype, tolerance,
                                                        kernel_path):
    """Many query heads over one long kv head (T5's cross-attention over encoder states: 12 x 768): the native
    kernel's shared tiles (scores of 4 rows x 4 positions, values of 6 rows), rows of two kv heads inside one
    tile, row, position and lane tails, and contexts past its prefetch distances."""
    gen = _gen(num_heads * 1000 + head_size)
    lens = [1, 3, 4, 5, 17, 0, 40, 70]
    kc, vc, tables, keys, values = _build_paged(gen, lens, 16, num_kv_heads, head_size, dtype)
    query = _randn(gen, len(lens), num_heads, head_size, dtype=dtype)
    context_lens = torch.tensor(lens, dtype=torch.int32)
    out = paged_attention(query, kc, vc, tables, context_lens, head_size ** -0.5)
    assert out.dtype == dtype and torch.isfinite(out).all()
    expected = ref_paged_attention(query.float(), kc.float(), vc.float(), tables, context_lens, head_size ** -0.5)
    torch.testing.assert_close(out.float(), expected, atol=tolerance, rtol=tolerance)
    live = [i for i, n in enumerate(lens) if n > 0]
    dense = _dense_sdpa(query, keys, values, lens, head_size ** -0.5)
    torch.testing.assert_close(out.float()[live], dense[live], atol=tolerance, rtol=tolerance)


@pytest.mark.parametrize("chunk_bytes", [1, 40_000])
def test_paged_attention_chunked_matches_single_pass(monkeypatch, chunk_bytes):
    gen = _gen(11)
    lens = [0, 0, 5, 64, 1, 100, 0, 33, 17]
    kc, vc, tables, _, _ = _build_paged(gen, lens, 16, 2, 64, torch.float32, table_pad=-1)
    query = _randn(gen, len(lens), 6, 64)
    context_lens = torch.tensor(lens)
    single = paged_attention(query, kc, vc, tables, context_lens, 0.125)
    monkeypatch.setattr(decode_attention, "CPU_CHUNK_BYTES", chunk_bytes)
    chunked = paged_attention(query, kc, vc, tables, context_lens, 0.125, max_context_len=100)
    torch.testing.assert_close(chunked, single, atol=1e-6, rtol=1e-6)
    expected = ref_paged_attention(query, kc, vc, tables, context_lens, 0.125)
    torch.testing.assert_close(chunked, expected, atol=1e-5, rtol=1e-5)


def test_paged_attention_edge_batches(kernel_path):
    gen = _gen(3)
    kc, vc, tables, _, _ = _build_paged(gen, [4], 4, 2, 64, torch.float32)
    empty = paged_attention(torch.randn(0, 2, 64), kc, vc, tables[:0], torch.zeros(0, dtype=torch.int32), 1.0)
    assert empty.shape == (0, 2, 64)
    query = _randn(gen, 2, 2, 64)
    all_zero = paged_attention(query, kc, vc, tables.repeat(2, 1), torch.zeros(2, dtype=torch.int32), 1.0)
    assert torch.equal(all_zero, torch.zeros_like(query))
    with pytest.raises(ValueError, match="exceeds the block table capacity"):
        paged_attention(query, kc, vc, tables.repeat(2, 1), torch.tensor([4, 99]), 1.0)
    outside = tables.repeat(2, 1)
    outside[1, 0] = kc.shape[0]  # a block number past the end of the cache
    with pytest.raises((ValueError, IndexError, RuntimeError)):
        paged_attention(query, kc, vc, outside, torch.tensor([4, 4]), 1.0)
    if kernel_path == "native":  # int64 tables: an entry that int32 would wrap into range is still refused
        wrapping = tables.repeat(2, 1).long()
        wrapping[1, 0] = 2 ** 32
        with pytest.raises(ValueError, match="outside the KV cache"):
            paged_attention(query, kc, vc, wrapping, torch.tensor([4, 4]), 1.0)


def test_native_kernel_matches_torch_path_on_noncontiguous_and_odd_shapes(monkeypatch):
    """Random shapes through both paths; a non-contiguous cache view falls back to torch and still agrees."""
    gen = _gen(5)
    lens = [3, 77, 1, 16, 250]
    kc, vc, tables, _, _ = _build_paged(gen, lens, 16, 3, 72, torch.float32)
    query = _randn(gen, len(lens), 6, 72)
    context_lens = torch.tensor(lens)
    monkeypatch.setenv(native.NATIVE_ENV, "1")
    native.load_library.cache_clear()
    fused = paged_attention(query, kc, vc, tables, context_lens, 0.3)
    wide_k = torch.cat([kc, kc], dim=-1)[..., :72]  # same values, non-contiguous
    wide_v = torch.cat([vc, vc], dim=-1)[..., :72]
    fallback = paged_attention(query, wide_k, wide_v, tables, context_lens, 0.3)
    monkeypatch.setenv(native.NATIVE_ENV, "0")
    native.load_library.cache_clear()
    assert native.load_library("paged_attention_cpu") is None
    plain = paged_attention(query, kc, vc, tables, context_lens, 0.3)
    native.load_library.cache_clear()
    torch.testing.assert_close(fused, plain, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(fallback, plain, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("block_size", [1, 2, 16, 32])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_reshape_and_cache(block_size, dtype):
    gen = _gen(block_size + 100)
    num_blocks, num_kv_heads, head_size, num_tokens = 40 // block_size + 6, 3, 40, 23
    shape = (num_blocks, block_size, num_kv_heads, head_size)
    key_cache, value_cache = _randn(gen, *shape, dtype=dtype), _randn(gen, *shape, dtype=dtype)
    ref_key_cache, ref_value_cache = key_cache.clone(), value_cache.clone()
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:num_tokens]
    slots[torch.tensor([0, 5, 6, 22])] = -1
    key = _randn(gen, num_tokens, num_kv_heads, head_size, dtype=dtype)
    value = _randn(gen, num_tokens, num_kv_heads, head_size, dtype=dtype)
    reshape_and_cache(key, value, key_cache, value_cache, slots)
    ref_reshape_and_cache(key, value, ref_key_cache, ref_value_cache, slots)
    assert torch.equal(key_cache, ref_key_cache) and torch.equal(value_cache, ref_value_cache)
    slot = int(slots[1])
    assert torch.equal(key_cache[slot // block_size, slot % block_size], key[1])
    assert not torch.equal(key_cache, _randn(_gen(block_size + 100), *shape, dtype=dtype))


@pytest.mark.parametrize("all_slots_valid", [True, False])
def test_reshape_and_cache_into_non_contiguous_caches(all_slots_valid):
    """Cache views with other strides take the block/offset path and write the same values as the reference."""
    gen = _gen(55)
    wide = _randn(gen, 2, 6, 8, 2, 32)  # [k/v, blocks, block_size, heads, head_size * 2]
    key_cache, value_cache = wide[0, ..., :16], wide[1, ..., :16]
    assert not key_cache.is_contiguous()
    ref_key_cache, ref_value_cache = key_cache.clone(), value_cache.clone()
    slots = torch.randperm(6 * 8, generator=gen)[:10]
    if not all_slots_valid:
        slots[3] = -1
    key, value = _randn(gen, 10, 2, 16), _randn(gen, 10, 2, 16)
    reshape_and_cache(key, value, key_cache, value_cache, slots)
    ref_reshape_and_cache(key, value, ref_key_cache, ref_value_cache, slots)
    assert torch.equal(key_cache, ref_key_cache) and torch.equal(value_cache, ref_value_cache)
    assert torch.equal(wide[0, ..., 16:], _randn(_gen(55), 2, 6, 8, 2, 32)[0, ..., 16:])  # nothing else written


@pytest.mark.parametrize("native_on", ["1", "0"])
@pytest.mark.parametrize("num_tokens", [7, 700])   # 700 rows of 2 KB: past 1 MiB, the native copy runs on threads
def test_reshape_and_cache_from_views_of_a_fused_projection(monkeypatch, native_on, num_tokens):
    """K and V as column slices of one [tokens, 3 * width] qkv output (rows strided), on both paths."""
    monkeypatch.setenv(native.NATIVE_ENV, native_on)
    native.load_library.cache_clear()
    gen = _gen(num_tokens)
    heads, head_size, block_size = 8, 64, 16
    num_blocks = num_tokens // block_size + 4
    shape = (num_blocks, block_size, heads, head_size)
    key_cache, value_cache = _randn(gen, *shape), _randn(gen, *shape)
    ref_key_cache, ref_value_cache = key_cache.clone(), value_cache.clone()
    qkv = _randn(gen, num_tokens, 3 * heads * head_size)
    _, key, value = (part.view(num_tokens, heads, head_size) for part in qkv.split(heads * head_size, dim=1))
    assert key.stride(0) == 3 * heads * head_size
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:num_tokens]
    slots[::5] = -1
    reshape_and_cache(key, value, key_cache, value_cache, slots.to(torch.int32))
    ref_reshape_and_cache(key, value, ref_key_cache, ref_value_cache, slots)
    native.load_library.cache_clear()
    assert torch.equal(key_cache, ref_key_cache) and torch.equal(value_cache, ref_value_cache)


def test_reshape_and_cache_rejects_a_slot_past_the_cache_and_writes_nothing():
    gen = _gen(3)
    key_cache, value_cache = _randn(gen, 4, 16, 2, 8), _randn(gen, 4, 16, 2, 8)
    before = key_cache.clone()
    key, value = _randn(gen, 3, 2, 8), _randn(gen, 3, 2, 8)
    with pytest.raises(ValueError, match="slot_mapping: slot 64 is past the cache's 64 slots"):
        reshape_and_cache(key, value, key_cache, value_cache, torch.tensor([5, 64, 2]))
    assert torch.equal(key_cache, before)


def test_reshape_and_cache_casts_to_the_cache_dtype():
    gen = _gen(4)
    key_cache = torch.zeros(4, 16, 2, 8, dtype=torch.bfloat16)
    value_cache = torch.zeros_like(key_cache)
    key, value = _randn(gen, 3, 2, 8), _randn(gen, 3, 2, 8)
    reshape_and_cache(key, value, key_cache, value_cache, torch.tensor([5, 17, 2]))
    assert torch.equal(key_cache[1, 1], key[1].to(torch.bfloat16))
    assert torch.equal(value_cache[0, 2], value[2].to(torch.bfloat16))


def test_reshape_and_cache_then_attend():
    gen = _gen(21)
    block_size, num_kv_heads, head_size, lens = 16, 2, 64, [20, 3, 40]
    kc = torch.full((12, block_size, num_kv_heads, head_size), float("nan"))
    vc = kc.clone()
    tables = torch.tensor([[7, 2, 0], [5, 0, 0], [1, 9, 3]], dtype=torch.int32)
    slots = torch.cat([tables[i, torch.arange(n) // block_size] * block_size + torch.arange(n) % block_size
                       for i, n in enumerate(lens)]).long()
    key = _randn(gen, sum(lens) + 2, num_kv_heads, head_size)  # two trailing padding tokens
    value = _randn(gen, sum(lens) + 2, num_kv_heads, head_size)
    reshape_and_cache(key, value, kc, vc, torch.cat([slots, torch.tensor([-1, -1])]))
    query = _randn(gen, 3, 4, head_size)
    out = paged_attention(query, kc, vc, tables, torch.tensor(lens), head_size**-0.5)
    keys, values = torch.split(key[:-2], lens), torch.split(value[:-2], lens)
    torch.testing.assert_close(out, _dense_sdpa(query, keys, values, lens, head_size**-0.5), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_copy_blocks(dtype):
    gen = _gen(5)
    shape = (20, 16, 2, 64)
    key_caches = [_randn(gen, *shape, dtype=dtype) for _ in range(3)]
    value_caches = [_randn(gen, *shape, dtype=dtype) for _ in range(3)]
    ref_keys = [c.clone() for c in key_caches]
    ref_values = [c.clone() for c in value_caches]
    mapping = torch.tensor([[3, 10], [3, 11], [0, 19], [7, 4]], dtype=torch.int64)
    copy_blocks(key_caches, value_caches, mapping)
    ref_copy_blocks(ref_keys, ref_values, mapping)
    for got, want in zip(key_caches + value_caches, ref_keys + ref_values):
        assert torch.equal(got, want)
    assert torch.equal(key_caches[2][11], key_caches[2][3]) and torch.equal(value_caches[1][19], value_caches[1][0])
    copy_blocks(key_caches, value_caches, torch.zeros(0, 2, dtype=torch.int64))


def _swap_devices():
    devices = [("cpu", "cpu")]
    if torch.cuda.is_available():
        devices += [("cuda", "cpu"), ("cpu", "cuda")]
    return devices


@pytest.mark.parametrize("src_device,dst_device", _swap_devices())
def test_swap_blocks(src_device, dst_device):
    gen = _gen(9)
    for layer in range(2):
        src = _randn(gen, 12, 8, 2, 40).to(src_device)
        dst = _randn(gen, 6, 8, 2, 40).to(dst_device)
        ref_dst = dst.clone()
        mapping = torch.tensor([[11, 0], [2, 5], [layer, 3]])
        swap_blocks(src, dst, mapping)
        ref_swap_blocks(src, ref_dst, mapping)
        assert torch.equal(dst, ref_dst) and torch.equal(dst[5].cpu(), src[2].cpu())
        assert torch.equal(dst[1], ref_dst[1])


def test_native_kernel_reads_shared_cross_tables_once_per_run(monkeypatch):
    """Beams of a request share one block-table row (the kernel reads such a run's K/V once): still the reference.

    Runs: three beams of request 0, one of 1, two of 2 that differ only past their used blocks, request 0 again,
    and two zero-length rows."""
    gen = _gen(21)
    kc, vc, tables, _, _ = _build_paged(gen, [40, 9, 130, 0], 16, 2, 64, torch.float32)
    beams = [0, 0, 0, 1, 2, 2, 0, 3, 3]
    beam_tables, beam_lens = tables[beams].clone(), torch.tensor([40, 9, 130, 0])[beams]
    beam_tables[5, -1] = 12345  # beyond request 2's used blocks: never read, must not matter
    query = _randn(gen, len(beams), 8, 64)
    monkeypatch.setenv(native.NATIVE_ENV, "1")
    native.load_library.cache_clear()
    out = paged_attention(query, kc, vc, beam_tables, beam_lens, 0.125)
    native.load_library.cache_clear()
    expected = ref_paged_attention(query, kc, vc, beam_tables, beam_lens, 0.125)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    assert torch.count_nonzero(out[7:]) == 0


def test_kernel_benchmark_times_every_layer_and_the_read_floor(capsys):
    from seq2seq_engine.kernels import benchmark

    benchmark.main(["--batch", "2", "--context", "20", "--heads", "4", "--kv-heads", "2", "--layers", "3",
                    "--repeats", "2"])
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 4 and "'layers': 3" in lines[0]
    for label, line in zip(["paged_attention", "read floor", "dense SDPA"], lines[1:]):
        assert line.startswith(label)
        best, median = map(float, re.search(r"best ([0-9.]+) ms, median ([0-9.]+) ms", line).groups())
        assert 0 <= best <= median
