"""The Triton KV-cache ops against plain-torch references on random inputs: token writes into their paged slots (the
cache dtype's conversion, padding slots of -1 leaving the cache untouched, strided inputs) and block copies in every
layer with all sources read before any destination is written. CPU tensors run the kernels' source through Triton's
interpreter; on a CUDA machine the same cases also run compiled on the GPU."""
import pytest
import torch

from seq2seq_engine.kernels.triton_cache import copy_paged_blocks, write_to_paged_cache

pytestmark = pytest.mark.gpu_kernel
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("source_dtype,cache_dtype,slot_dtype", [
    (torch.float32, torch.float32, torch.int64), (torch.float32, torch.bfloat16, torch.int32),
    (torch.bfloat16, torch.bfloat16, torch.int64), (torch.float32, torch.float16, torch.int32)])
def test_write_puts_each_token_in_its_slot_and_skips_padding(device, source_dtype, cache_dtype, slot_dtype):
    gen = torch.Generator().manual_seed(0)
    num_blocks, block_size, num_kv_heads, head_size = 7, 16, 3, 80
    key_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_size, generator=gen).to(device, cache_dtype)
    value_cache = torch.randn(key_cache.shape, generator=gen).to(device, cache_dtype)
    # key and value as the strided halves of one projection, as a model's fused kv output gives them
    fused = torch.randn(9, num_kv_heads, 2 * head_size, generator=gen).to(device, source_dtype)
    key, value = fused[..., :head_size], fused[..., head_size:]
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:9]
    slots[[2, 5]] = -1
    expected_key, expected_value = key_cache.clone(), value_cache.clone()
    for token, slot in enumerate(slots.tolist()):
        if slot >= 0:
            expected_key[slot // block_size, slot % block_size] = key[token].to(cache_dtype)
            expected_value[slot // block_size, slot % block_size] = value[token].to(cache_dtype)
    before = key_cache.clone()
    write_to_paged_cache(key, value, key_cache, value_cache, slots.to(device, slot_dtype))
    assert not torch.equal(key_cache, before)
    assert torch.equal(key_cache, expected_key) and torch.equal(value_cache, expected_value)


def test_write_rejects_bad_inputs():
    cache = torch.zeros(2, 16, 2, 64)
    tokens = torch.randn(3, 2, 64)
    with pytest.raises(ValueError, match="slot_mapping: slot 32 is past the cache's 32 slots"):
        write_to_paged_cache(tokens, tokens, cache, cache.clone(), torch.tensor([0, 32, 1]))
    with pytest.raises(ValueError, match="do not fit the caches"):
        write_to_paged_cache(tokens, tokens, torch.zeros(2, 16, 4, 64), torch.zeros(2, 16, 4, 64),
                             torch.tensor([0, 1, 2]))
    with pytest.raises(TypeError, match="slot_mapping must be int32 or int64"):
        write_to_paged_cache(tokens, tokens, cache, cache.clone(), torch.tensor([0.0, 1.0, 2.0]))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_copy_blocks_reads_every_source_before_writing(device, dtype):
    gen = torch.Generator().manual_seed(1)
    shape = (8, 16, 2, 80)
    key_caches = [torch.randn(shape, generator=gen).to(device, dtype) for _ in range(2)]
    value_caches = [torch.randn(shape, generator=gen).to(device, dtype) for _ in range(2)]
    # block 2 is a destination and a source: its old content must reach block 6
    mapping = torch.tensor([[0, 2], [2, 6], [5, 1], [5, 3]], device=device)
    expected = []
    for cache in key_caches + value_caches:
        copied = cache.clone()
        sources = [cache[src].clone() for src, _ in mapping.tolist()]
        for (_, dst), block in zip(mapping.tolist(), sources):
            copied[dst] = block
        expected.append(copied)
    copy_paged_blocks(key_caches, value_caches, mapping)
    for cache, want in zip(key_caches + value_caches, expected):
        assert torch.equal(cache, want)


def test_copy_blocks_of_an_empty_mapping_changes_nothing_and_bad_mappings_raise():
    cache = torch.randn(3, 16, 2, 64)
    before = cache.clone()
    copy_paged_blocks([cache], [cache], torch.zeros(0, 2, dtype=torch.int64))
    assert torch.equal(cache, before)
    with pytest.raises(ValueError, match=r"block_mapping must be \[num_pairs, 2\]"):
        copy_paged_blocks([cache], [cache], torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="1 key caches vs 2 value caches"):
        copy_paged_blocks([cache], [cache, cache], torch.tensor([[0, 1]]))
