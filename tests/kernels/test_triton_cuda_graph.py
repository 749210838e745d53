"""The Triton decode step under a CUDA graph: a cache write and the paged attention captured once and replayed after
the step's inputs (tokens, slots, context lengths, block tables, T5 query positions) change in place give what the
eager calls give on the new inputs. Needs a CUDA device (the kernels' CPU tests run through the interpreter)."""
import pytest
import torch
from test_triton_attention import make_bias, make_paged

from seq2seq_engine.kernels.triton_attention import paged_decode_attention
from seq2seq_engine.kernels.triton_cache import write_to_paged_cache

pytestmark = [pytest.mark.gpu_kernel, pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")]


def _step(inputs, caches, out):
    key_cache, value_cache = caches
    write_to_paged_cache(inputs["key"], inputs["value"], key_cache, value_cache, inputs["slots"])
    return paged_decode_attention(inputs["query"], key_cache, value_cache, inputs["tables"], inputs["lens"], 1.0,
                                  relative_bias=inputs["bias"], out=out)


def _inputs(seed, lens, caches, tables):
    gen = torch.Generator().manual_seed(seed)
    _, block_size, num_kv_heads, head_size = caches[0].shape
    token = torch.randn(len(lens), num_kv_heads, head_size, generator=gen).cuda()
    slots = torch.tensor([int(tables[i, (n - 1) // block_size]) * block_size + (n - 1) % block_size
                          for i, n in enumerate(lens)]).cuda()
    slots[-1] = -1  # a padding row
    bias, _ = make_bias(gen, (False, 32, 128), lens, 2 * num_kv_heads, torch.float32, "cuda")
    return dict(key=token, value=-token, slots=slots, query=torch.randn(len(lens), 2 * num_kv_heads, head_size,
                generator=gen).cuda(), tables=tables.clone(), lens=torch.tensor(lens, dtype=torch.int32).cuda(),
                bias=bias)


def test_captured_step_replays_with_new_inputs():
    gen = torch.Generator().manual_seed(0)
    key_cache, value_cache, tables = make_paged(gen, [40, 17, 90, 5], 16, 2, 64, torch.float32, "cuda")
    static = _inputs(1, [40, 17, 90, 5], (key_cache, value_cache), tables)
    out = torch.empty_like(static["query"])
    _step(static, (key_cache, value_cache), out)  # compiles the kernels outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _step(static, (key_cache, value_cache), out)
    fresh = _inputs(2, [41, 3, 90, 4], (key_cache, value_cache), tables)  # within the blocks each holds
    for name in ("key", "value", "slots", "query", "tables", "lens"):
        static[name].copy_(fresh[name])
    static["bias"].query_positions.copy_(fresh["bias"].query_positions)
    static["bias"].table.copy_(fresh["bias"].table)
    eager_caches = (key_cache.clone(), value_cache.clone())
    expected = _step(fresh, eager_caches, None)
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=0)
    torch.testing.assert_close(key_cache, eager_caches[0], equal_nan=True, atol=0, rtol=0)
