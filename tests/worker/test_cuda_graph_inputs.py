"""The decode graphs' inputs without a GPU: batch-size buckets, padding rows, the static buffer's layout and views,
and the one-copy packing of a step's host tensors."""
import numpy as np
import pytest
import torch

from seq2seq_engine.worker.cuda_graphs import (DecodeGraphs, decode_graph_fields, field_layout, graph_batch_size,
                                               graph_batch_sizes, pad_rows, run_eagerly, table_rows)
from seq2seq_engine.worker.host_to_device import pack_to_device


def _reference_buckets(max_num_seqs, cap):
    """vLLM's rule written out by enumeration: 1, 2, 4, then every multiple of 8, up to the first bucket >= the
    largest batch."""
    largest = min(max_num_seqs, cap)
    buckets = []
    for size in [1, 2, 4] + [8 * i for i in range(1, 200)]:
        buckets.append(size)
        if size >= largest:
            return buckets


@pytest.mark.parametrize("max_num_seqs", [1, 2, 3, 4, 5, 8, 9, 16, 17, 100, 256, 300, 1024])
def test_buckets_follow_vllm_rule_up_to_the_cap(max_num_seqs):
    assert graph_batch_sizes(max_num_seqs) == _reference_buckets(max_num_seqs, 256)
    assert graph_batch_sizes(max_num_seqs, cap=64) == _reference_buckets(max_num_seqs, 64)


def test_batch_goes_to_smallest_bucket_that_holds_it():
    sizes = graph_batch_sizes(40)
    for num_seqs in range(1, 41):
        bucket = graph_batch_size(num_seqs, sizes)
        assert bucket >= num_seqs and bucket in sizes
        assert all(size < num_seqs for size in sizes if size < bucket)
    assert graph_batch_size(41, sizes) is None and graph_batch_size(0, sizes) is None
    with pytest.raises(ValueError, match="max_num_seqs"):
        graph_batch_sizes(0)


def test_pad_rows_appends_fill_rows_and_refuses_overflow():
    rng = np.random.default_rng(0)
    values = rng.integers(1, 1000, size=(3, 5)).astype(np.int32)
    padded = pad_rows(values, 8, -1)
    assert padded.dtype == np.int32 and padded.shape == (8, 5)
    np.testing.assert_array_equal(padded[:3], values)
    assert (padded[3:] == -1).all()
    with pytest.raises(ValueError, match="do not fit"):
        pad_rows(values, 2, 0)
    tables = table_rows([[7, 3], [9], [4, 5, 6]], 4)
    np.testing.assert_array_equal(tables, [[7, 3, 0, 0], [9, 0, 0, 0], [4, 5, 6, 0]])
    with pytest.raises(ValueError, match="does not fit"):
        table_rows([[1, 2, 3]], 2)


@pytest.mark.parametrize("batch_size", [1, 3, 8, 24])
def test_layout_fields_are_aligned_and_disjoint(batch_size):
    fields = decode_graph_fields(self_table_width=7, cross_table_width=5)
    layout, used = field_layout(fields, batch_size)
    spans = []
    for field in fields:
        offset, shape = layout[field.name]
        assert offset % 64 == 0 and shape[0] == batch_size
        spans.append((offset, offset + int(np.prod(shape)) * torch.empty((), dtype=field.dtype).element_size()))
    spans.sort()
    assert all(end <= next_start for (_, end), (next_start, _) in zip(spans, spans[1:])) and spans[-1][1] <= used
    assert used <= field_layout(fields, 32)[1]   # every bucket fits the buffer sized for the largest


def _graphs(cross_table_width=3):
    return DecodeGraphs(torch.nn.Identity(), torch.device("cpu"), [1, 2, 4, 8], block_size=4, self_table_width=6,
                        cross_table_width=cross_table_width, capture=run_eagerly)


def test_prepare_writes_real_rows_then_dummy_rows():
    rng = np.random.default_rng(1)
    rows = dict(input_ids=rng.integers(1, 100, 3), positions=rng.integers(1, 20, 3),
                slot_mapping=rng.integers(0, 50, 3), selected=np.array([0, 1, 2]),
                context_lens=rng.integers(1, 20, 3), block_tables=rng.integers(1, 12, (3, 6)).astype(np.int32),
                encoder_lens=rng.integers(1, 12, 3), cross_block_tables=rng.integers(1, 12, (3, 3)).astype(np.int32))
    graphs = _graphs()
    graphs.prepare({name: np.full_like(value, 77) for name, value in rows.items()}, 8, 3)  # stale values first
    step = graphs.prepare(rows, 4, 3)
    self_md, cross_md = step.attn_metadata.self_attn, step.attn_metadata.cross
    got = dict(input_ids=step.input_ids, positions=step.positions, slot_mapping=self_md.slot_mapping,
               context_lens=self_md.decode_seq_lens, block_tables=self_md.decode_block_tables,
               encoder_lens=cross_md.decode_encoder_lens, cross_block_tables=cross_md.decode_block_tables)
    dummy = dict(input_ids=0, positions=0, slot_mapping=-1, context_lens=0, block_tables=0, encoder_lens=0,
                 cross_block_tables=0)
    for name, tensor in got.items():
        assert tensor.shape[0] == 4
        np.testing.assert_array_equal(tensor[:3].numpy(), rows[name], err_msg=name)
        assert (tensor[3:] == dummy[name]).all(), name
    assert step.input_ids.dtype == torch.int64 and self_md.decode_block_tables.dtype == torch.int32
    np.testing.assert_array_equal(step.selected.numpy(), [0, 1, 2])
    # the kernels size their work from capacity bounds, never from this step's lengths
    assert self_md.max_decode_seq_len == 6 * 4 and cross_md.max_decode_encoder_len == 3 * 4
    assert step.attn_metadata.num_prefills == 0 and step.attn_metadata.num_decode_tokens == 4
    assert graphs.prepare(rows, 4, 3).attn_metadata is step.attn_metadata   # one static metadata per bucket


def test_decoder_only_graphs_have_no_cross_inputs():
    graphs = _graphs(cross_table_width=0)
    rows = dict(input_ids=[5], positions=[3], slot_mapping=[9], selected=[0], context_lens=[4],
                block_tables=[[2, 0, 0, 0, 0, 0]])
    step = graphs.prepare({name: np.asarray(value) for name, value in rows.items()}, 2, 1)
    assert step.attn_metadata.cross is None and step.input_ids.tolist() == [5, 0]


def test_graphs_are_captured_once_per_bucket_and_again_for_new_caches():
    captured = []

    def capture(step):
        captured.append(step)
        return step

    class Model(torch.nn.Module):
        def forward(self, input_ids, positions, kv_caches, attn_metadata):
            return (input_ids + positions).float()[:, None] * kv_caches[0][0].sum()

    graphs = DecodeGraphs(Model(), torch.device("cpu"), [1, 2, 4], 4, 2, 0, capture)
    caches = [(torch.full((2, 4, 1, 1), 0.5), torch.zeros(2, 4, 1, 1))]
    rows = dict(input_ids=np.array([3, 4, 5]), positions=np.array([1, 1, 2]), slot_mapping=np.array([0, 1, 2]),
                selected=np.arange(3), context_lens=np.array([2, 2, 3]), block_tables=np.ones((3, 2), np.int32))
    graphs.prepare(rows, 4, 3)
    assert graphs.run(4, caches)[:, 0].tolist() == [16.0, 20.0, 28.0, 0.0]
    graphs.prepare({name: value[:1] for name, value in rows.items()}, 1, 1)
    graphs.run(1, caches)
    graphs.prepare(rows, 4, 3)
    graphs.run(4, caches)
    assert len(captured) == 2
    graphs.prepare(rows, 4, 3)
    assert graphs.run(4, [(torch.ones(2, 4, 1, 1), torch.zeros(2, 4, 1, 1))])[:, 0].tolist() == [32., 40., 56., 0.]
    assert len(captured) == 3


@pytest.mark.parametrize("seed", [0, 1])
def test_pack_to_device_keeps_values_dtypes_and_shapes(seed):
    generator = torch.Generator().manual_seed(seed)
    tensors = {"ids": torch.randint(-5, 1000, (7,), generator=generator),
               "table": torch.randint(0, 99, (3, 5), generator=generator, dtype=torch.int32),
               "features": torch.randn(2, 3, 11, generator=generator),
               "strided": torch.randn(6, 4, generator=generator).t(),
               "half": torch.randn(5, generator=generator).to(torch.bfloat16),
               "mask": torch.rand(9, generator=generator) > 0.5,
               "empty": torch.zeros(0, 4, dtype=torch.int64), "absent": None}
    moved = pack_to_device(tensors, torch.device("cpu"))
    assert set(moved) == set(tensors) - {"absent"}
    storage = {tensor.untyped_storage().data_ptr() for tensor in moved.values() if tensor.numel()}
    assert len(storage) == 1                      # one buffer, so one copy on a device
    for name, tensor in moved.items():
        assert tensor.dtype == tensors[name].dtype and tensor.shape == tensors[name].shape, name
        assert torch.equal(tensor, tensors[name]), name
        assert tensor.data_ptr() % 64 == 0 or tensor.numel() == 0
    with pytest.raises(ValueError, match="meta"):
        pack_to_device({"x": torch.zeros(2, device="meta")}, torch.device("cpu"))


def test_pack_to_device_passes_tensors_already_there_through():
    generator = torch.Generator().manual_seed(3)
    there = torch.empty(4, 5, device="meta")
    host = torch.randint(0, 9, (6,), generator=generator)
    moved = pack_to_device({"features": there, "ids": host}, torch.device("meta"))
    assert moved["features"] is there
    assert moved["ids"].device.type == "meta" and moved["ids"].shape == host.shape


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_window_features_are_computed_on_the_engine_device():
    from types import SimpleNamespace

    import numpy as np

    from seq2seq_engine.transcription.input.windows import features_for

    samples = np.random.default_rng(0).standard_normal(16000 * 7).astype(np.float32) * 0.1
    on_gpu = features_for(SimpleNamespace(num_mel_bins=128, max_encoder_len=1500, device=torch.device("cuda")), samples)
    on_cpu = features_for(SimpleNamespace(num_mel_bins=128, max_encoder_len=1500, device=torch.device("cpu")), samples)
    assert on_gpu.is_cuda and on_gpu.shape == on_cpu.shape == (128, 3000)
    assert torch.allclose(on_gpu.cpu(), on_cpu, atol=1e-4)
    moved = pack_to_device({"features": on_gpu, "ids": torch.arange(3)}, torch.device("cuda"))
    assert moved["features"] is on_gpu and moved["ids"].is_cuda
