"""The native paged decode attention over runs of sequences sharing one block table (the beams of a request over its
cross-attention table), whose rows reading one kv head the kernel walks together: runs of 1 to 8 sequences, MHA,
GQA and MQA, head sizes 64 and ones that leave a partial register (40, 80, 20), float32 and bfloat16 caches,
contexts around its chunk and tile sizes, with and without a position bias, against a plain-torch float64 reference
on random inputs, in every build this CPU can run (AVX-512, AVX2 and portable)."""
import platform

import pytest
import torch
from kernel_reference import random_paged_cache
from linear_isa import MARCH_FLAGS, attention_isa, cpu_flags, target_flags

from seq2seq_engine.kernels import native
from seq2seq_engine.kernels.native_attention import native_paged_attention, paged_attention_isa
from seq2seq_engine.platforms.cpu_policy import MARCH_ENV

BUILDS = ["native", "x86-64-v3", "x86-64-v2"]  # this CPU's (AVX-512 where it has it), AVX2, the portable loops


@pytest.fixture(params=BUILDS)
def build(request, monkeypatch):
    """The kernel compiled for one -march (each loads its own library), checked to report its code path."""
    if request.param == "native":
        monkeypatch.delenv(MARCH_ENV, raising=False)
        flags = target_flags()   # this CPU's, or what a SEQ2SEQ_ENGINE_CPU_ISA cap targets
    else:
        flags = MARCH_FLAGS[request.param]
        if platform.machine() not in ("x86_64", "AMD64") or not flags <= cpu_flags():
            pytest.skip(f"this CPU cannot run a -march={request.param} build")
        monkeypatch.setenv(MARCH_ENV, request.param)
    monkeypatch.setenv(native.NATIVE_ENV, "1")
    native.load_library.cache_clear()
    assert paged_attention_isa() == attention_isa(flags)
    yield request.param
    native.load_library.cache_clear()


def _reference(query, key_cache, value_cache, tables, lens, scale, bias=None):
    """One float64 softmax per sequence and query head over the K/V its block table names."""
    num_seqs, num_heads, head_size = query.shape
    group = num_heads // key_cache.shape[2]
    block_size = key_cache.shape[1]
    out = torch.zeros(num_seqs, num_heads, head_size, dtype=torch.float64)
    for seq in range(num_seqs):
        n = int(lens[seq])
        if n == 0:
            continue
        positions = torch.arange(n)
        blocks = tables[seq].long()[positions // block_size]
        keys = key_cache[blocks, positions % block_size].double().repeat_interleave(group, dim=1)
        values = value_cache[blocks, positions % block_size].double().repeat_interleave(group, dim=1)
        scores = torch.einsum("hd,thd->ht", query[seq].double(), keys) * scale
        if bias is not None:
            scores = scores + bias[seq, :, :n].double()
        out[seq] = torch.einsum("ht,thd->hd", torch.softmax(scores, dim=1), values)
    return out


def _beams(tables, lens, beams):
    """Each request's table and length repeated for its beams: consecutive equal rows, one run each."""
    index = torch.repeat_interleave(torch.arange(len(beams)), torch.tensor(beams))
    return tables[index].contiguous(), torch.tensor(lens, dtype=torch.int32)[index]


TOLERANCE = 2e-5  # float32 sums; the reference reads the same (bfloat16-rounded) cache


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("num_heads,num_kv_heads", [(8, 8), (8, 2), (6, 1)])
@pytest.mark.parametrize("head_size", [64, 40, 80])
def test_runs_of_beams_match_a_float64_reference(build, dtype, num_heads, num_kv_heads, head_size):
    """Requests of 2 to 8 beams and one of a single sequence; contexts below one tile of positions, around the
    chunk of positions, past the prefetch distances, and Whisper's 1,500 encoder positions."""
    gen = torch.Generator().manual_seed(num_heads * 1000 + num_kv_heads * 100 + head_size)
    beams = [5, 2, 1, 8, 3, 7, 4, 6]
    lens = [1500, 3, 37, 33, 100, 31, 64, 250]
    key_cache, value_cache, tables = random_paged_cache(gen, lens, 16, num_kv_heads, head_size, dtype)
    beam_tables, beam_lens = _beams(tables, lens, beams)
    query = torch.randn(len(beam_lens), num_heads, head_size, generator=gen)
    scale = head_size ** -0.5
    out = native_paged_attention(query, key_cache, value_cache, beam_tables, beam_lens, scale)
    expected = _reference(query, key_cache, value_cache, beam_tables, beam_lens, scale)
    torch.testing.assert_close(out.double(), expected, atol=TOLERANCE, rtol=TOLERANCE)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("num_heads,num_kv_heads", [(8, 8), (6, 2)])
def test_runs_of_beams_with_a_position_bias(build, dtype, num_heads, num_kv_heads):
    """A per-sequence, per-head bias row (T5's relative position bias) on runs of beams: each row keeps its own."""
    gen = torch.Generator().manual_seed(num_heads + num_kv_heads)
    beams, lens, head_size = [4, 1, 3, 2], [70, 9, 45, 4], 20
    key_cache, value_cache, tables = random_paged_cache(gen, lens, 8, num_kv_heads, head_size, dtype)
    beam_tables, beam_lens = _beams(tables, lens, beams)
    query = torch.randn(len(beam_lens), num_heads, head_size, generator=gen)
    bias = torch.randn(len(beam_lens), num_heads, max(lens) + 5, generator=gen) * 3.0
    out = native_paged_attention(query, key_cache, value_cache, beam_tables, beam_lens, 0.3, position_bias=bias)
    expected = _reference(query, key_cache, value_cache, beam_tables, beam_lens, 0.3, bias)
    torch.testing.assert_close(out.double(), expected, atol=TOLERANCE, rtol=TOLERANCE)


def test_runs_of_beams_with_empty_and_block_aligned_contexts(build):
    """A run with no cached positions is zeros; contexts a multiple of the block size; a block-table entry outside
    the cache in a run of beams is refused."""
    gen = torch.Generator().manual_seed(7)
    beams, lens = [3, 2, 4], [0, 32, 48]
    key_cache, value_cache, tables = random_paged_cache(gen, [1, 32, 48], 16, 4, 64, torch.float32)
    beam_tables, beam_lens = _beams(tables, lens, beams)
    query = torch.randn(len(beam_lens), 4, 64, generator=gen)
    out = native_paged_attention(query, key_cache, value_cache, beam_tables, beam_lens, 0.125)
    assert torch.count_nonzero(out[:3]) == 0
    expected = _reference(query, key_cache, value_cache, beam_tables, beam_lens, 0.125)
    torch.testing.assert_close(out.double(), expected, atol=TOLERANCE, rtol=TOLERANCE)
    beam_tables[5:, 2] = key_cache.shape[0]
    with pytest.raises(ValueError, match="outside the KV cache"):
        native_paged_attention(query, key_cache, value_cache, beam_tables, beam_lens, 0.125)
