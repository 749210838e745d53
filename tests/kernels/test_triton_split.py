"""The split-K (flash-decoding) paged decode attention and the kernels' tuning overrides against the float64
plain-torch reference of test_triton_attention on random inputs: contexts empty, of one token, inside one split,
across splits unevenly and of 1,500 tokens over a 94-block table; GQA; T5's relative bias; float32/bfloat16/float16.
CPU tensors run the kernels through Triton's interpreter; on a CUDA machine the same cases also run compiled."""
import pytest
import torch
from test_triton_attention import DEVICES, make_paged, run_case

from seq2seq_engine.kernels.triton_attention import paged_decode_attention
from seq2seq_engine.kernels.triton_split import choose_splits, split_length

pytestmark = pytest.mark.gpu_kernel


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("num_splits,num_heads,num_kv_heads,dtype", [
    (2, 4, 4, torch.float32), (3, 9, 3, torch.bfloat16), (7, 4, 2, torch.float16), (1, 9, 3, torch.float32)])
def test_split_self_attention_matches_reference(device, num_splits, num_heads, num_kv_heads, dtype):
    # width 8 x 16 = 128 tokens: splits of 64, 48 and 32 (the tile) tokens; 5 tokens sit inside one split, 70 and
    # 100 end part-way through a later split, and seven splits leave the last ones past every context
    out = run_case(device, [0, 1, 5, 70, 100], num_heads, num_kv_heads, 64, dtype, seed=10, width=8,
                   num_splits=num_splits)
    assert out[0].abs().max() == 0


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("num_splits,dtype", [(3, torch.bfloat16), (7, torch.float32)])
def test_split_cross_attention_over_whisper_encoder_output(device, num_splits, dtype):
    run_case(device, [1500, 777], 4, 4, 64, dtype, seed=11, width=94, num_splits=num_splits)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bidirectional", [False, True])
def test_split_with_t5_relative_bias(device, bidirectional):
    run_case(device, [0, 5, 130, 300], 9, 3, 64, torch.bfloat16, seed=12, bias_spec=(bidirectional, 32, 128),
             num_splits=3)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("overrides", [dict(tile=16, num_warps=1), dict(tile=64, num_warps=8),
                                       dict(tile=128, num_warps=2, num_splits=2)])
def test_tile_and_warp_overrides_give_the_same_result(device, overrides):
    run_case(device, [0, 37, 200], 9, 3, 64, torch.float16, seed=13, **overrides)


@pytest.mark.parametrize("device", DEVICES)
def test_split_writes_into_given_out_and_workspace(device):
    gen = torch.Generator().manual_seed(14)
    key_cache, value_cache, tables = make_paged(gen, [0, 40], 16, 2, 64, torch.float32, device)
    query = torch.randn(2, 4, 64, generator=gen).to(device)
    lens = torch.tensor([0, 40], dtype=torch.int32, device=device)
    expected = paged_decode_attention(query, key_cache, value_cache, tables, lens, 0.125, num_splits=1)
    out = torch.full_like(query, float("nan"))
    workspace = torch.full((2, 4, 3, 66), float("nan"), device=device)
    result = paged_decode_attention(query, key_cache, value_cache, tables, lens, 0.125, out=out, num_splits=3,
                                    workspace=workspace)
    assert result is out and torch.equal(out[0], torch.zeros_like(out[0]))
    torch.testing.assert_close(out, expected, atol=2e-6, rtol=0)
    with pytest.raises(ValueError, match="workspace must be"):
        paged_decode_attention(query, key_cache, value_cache, tables, lens, 0.125, num_splits=2, workspace=workspace)


@pytest.mark.parametrize("field,value", [("tile", 8), ("tile", 48), ("tile", 512), ("num_warps", 3),
                                         ("num_warps", 32), ("num_splits", 0), ("num_splits", 1.5)])
def test_bad_overrides_name_the_field(field, value):
    gen = torch.Generator().manual_seed(15)
    key_cache, value_cache, tables = make_paged(gen, [20], 16, 2, 64, torch.float32, "cpu")
    query, lens = torch.randn(1, 4, 64, generator=gen), torch.tensor([20], dtype=torch.int32)
    with pytest.raises(ValueError, match=field):
        paged_decode_attention(query, key_cache, value_cache, tables, lens, 1.0, **{field: value})


def test_split_heuristic(monkeypatch):
    from seq2seq_engine.kernels import triton_split
    monkeypatch.setattr(triton_split, "sm_count", lambda device: 132)
    cuda = torch.device("cuda", 0)
    assert choose_splits(20, 1504, 32, torch.device("cpu")) == 1  # the interpreter: one program per kv head
    assert choose_splits(128 * 20, 1504, 32, cuda) == 1  # 2,560 programs already fill 132 SMs four times over
    assert choose_splits(20, 128, 32, cuda) == 1  # a table of four tiles
    assert choose_splits(20, 1504, 32, cuda) == 16  # 528 / 20 wanted, capped at 16
    assert choose_splits(4 * 20, 1504, 32, cuda) == 7  # ceil(528 / 80)
    assert choose_splits(20, 160, 32, cuda) == 5  # at most one split per tile
    assert split_length(1504, 7, 32) == 224 and split_length(128, 7, 32) == 32 and split_length(1504, 1, 32) == 1504
