"""The grouped LoRA kernels (kernels/lora_ops.py: native, torch and Triton paths) against a float64 reference."""
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from linear_isa import MARCH_FLAGS, cpu_flags, target_flags

from seq2seq_engine.kernels import lora_ops, triton_lora
from seq2seq_engine.kernels.lora_ops import LoRARuns, lora_apply, lora_expand, lora_shrink
from seq2seq_engine.kernels.native_lora import lora_native_isa
from seq2seq_engine.kernels.triton_lora import triton_expand, triton_shrink
from seq2seq_engine.platforms import current_platform

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
# Slots of a batch's rows (-1: no adapter): runs of several lengths, -1 runs between them, slot 3 in two runs and a
# run of one row; one adapter for every row; 40 decode rows of 40 requests over 4 adapters; a prefill of 45 rows
# (its slot expanded from B's transpose by the native kernel) in two runs around other slots; no adapter at all.
SLOTS = {"runs": [-1, -1, 3, 3, 3, 3, 3, 3, 3, 0, 0, -1, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, -1, -1, 2, 2, 2, 2, 2, 0],
         "single": [2] * 11, "decode": [(7 * i) % 4 for i in range(40)],
         "prefill": [-1] * 3 + [1] * 38 + [0] * 5 + [-1] + [1] * 7 + [3], "none": [-1] * 9}
# Absolute tolerance relative to the largest expected magnitude: float32 accumulation; bfloat16/float16 rounding of
# t, of the update and of y (Triton's interpreter truncates to bfloat16).
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 3e-3}


def make_case(slots, in_features, out_features, rank, dtype=torch.float32, device="cpu", num_slots=4, seed=0):
    """x, a, b (random, never zero) and y, a column slice of a wider random output (the whole tensor returned too)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(len(slots), in_features, generator=gen)
    a = torch.randn(num_slots, rank, in_features, generator=gen) / in_features ** 0.5
    b = torch.randn(num_slots, out_features, rank, generator=gen)
    wide = torch.randn(len(slots), out_features + 13, generator=gen)
    x, a, b, wide = (tensor.to(device, dtype) for tensor in (x, a, b, wide))
    return x, a, b, wide, wide[:, 5:5 + out_features]


def reference(x, a, b, slots, y):
    """y + (x a[slot]^T) b[slot]^T row by row in float64 (rows of slot -1 as they are)."""
    expected = y.double().cpu().clone()
    for row, slot in enumerate(slots):
        if slot >= 0:
            expected[row] += (x[row].double().cpu() @ a[slot].double().cpu().T) @ b[slot].double().cpu().T
    return expected


def check(y, expected, wide_before, wide, slots, dtype):
    scale = max(1.0, float(expected.abs().max()))
    torch.testing.assert_close(y.double().cpu(), expected, atol=TOLERANCE[dtype] * scale, rtol=0)
    untouched = [row for row, slot in enumerate(slots) if slot < 0]
    assert torch.equal(wide[untouched], wide_before[untouched])  # rows without an adapter: bit for bit
    assert torch.equal(wide[:, :5], wide_before[:, :5]) and torch.equal(wide[:, -8:], wide_before[:, -8:])


@pytest.mark.parametrize("case", ["runs", "single", "decode", "prefill"])
@pytest.mark.parametrize("rank", [8, 16, 20, 48])
@pytest.mark.parametrize("in_features, out_features", [(72, 200), (203, 70)])  # tails of 16, 8 and 4 lanes
def test_apply_and_shrink_expand_match_the_reference(kernel_path, case, rank, in_features, out_features):
    slots = SLOTS[case]
    x, a, b, wide, y = make_case(slots, in_features, out_features, rank, seed=rank)
    runs = LoRARuns.from_slots(torch.tensor(slots))
    assert lora_ops._path(rank, x, a, b, y) == kernel_path
    expected, before = reference(x, a, b, slots, y), wide.clone()
    lora_apply(x, a, b, runs, y)
    check(y, expected, before, wide, slots, torch.float32)
    wide.copy_(before)
    t = lora_shrink(x, a, runs)
    assert t.shape == (len(slots), rank) and t.dtype == torch.float32
    lora_expand(t, b, runs, y)
    check(y, expected, before, wide, slots, torch.float32)


def test_a_batch_without_adapters_leaves_y_as_it_is(kernel_path):
    slots = SLOTS["none"]
    x, a, b, wide, y = make_case(slots, 72, 200, 16)
    runs = LoRARuns.from_slots(slots)
    before = wide.clone()
    lora_apply(x, a, b, runs, y)
    t = lora_shrink(x, a, runs)
    lora_expand(torch.randn(t.shape), b, runs, y)
    assert torch.equal(wide, before) and torch.equal(t, torch.zeros_like(t))


@pytest.mark.parametrize("rows, rank", [(1, 192), (3, 192), (600, 48)])
def test_threaded_paths_and_fused_qkv_rank(kernel_path, rows, rank):
    # one or three rows: fewer tiles than threads (ranks, then output columns shared among them); 600 rows in four
    # runs: tiles shared among the threads (each shrunk and expanded in turn by lora_apply)
    slots = [1] * rows if rows < 4 else [0] * 150 + [-1] * 50 + [3] * 200 + [1] * 150 + [2] * 50
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        x, a, b, wide, y = make_case(slots, 523, 262, rank, seed=rows)
        expected, before = reference(x, a, b, slots, y), wide.clone()
        runs = LoRARuns.from_slots(slots)
        lora_apply(x, a, b, runs, y)
        check(y, expected, before, wide, slots, torch.float32)
        wide.copy_(before)
        lora_expand(lora_shrink(x, a, runs), b, runs, y)
        check(y, expected, before, wide, slots, torch.float32)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", ["runs", "decode"])
def test_torch_path_in_half_precision(case, dtype):
    slots = SLOTS[case]
    x, a, b, wide, y = make_case(slots, 72, 200, 48, dtype=dtype)
    assert lora_ops._path(48, x, a, b, y) == "torch"
    expected, before = reference(x, a, b, slots, y), wide.clone()
    lora_apply(x, a, b, LoRARuns.from_slots(slots), y)
    check(y, expected, before, wide, slots, dtype)


def test_a_y_without_unit_column_stride_takes_the_torch_path(kernel_path):
    slots = SLOTS["runs"]
    x, a, b, _, _ = make_case(slots, 72, 40, 16)
    wide = torch.randn(40 + 3, len(slots))
    y = wide[1:41].T
    expected, before = reference(x, a, b, slots, y), wide.clone()
    lora_apply(x, a, b, LoRARuns.from_slots(slots), y)
    torch.testing.assert_close(y.double(), expected, atol=1e-5 * float(expected.abs().max()), rtol=0)
    assert torch.equal(wide[0], before[0]) and torch.equal(wide[41:], before[41:])


def test_runs_of_a_slot_array():
    runs = LoRARuns.from_slots(np.array(SLOTS["runs"], dtype=np.int64))
    assert runs.runs == [(2, 9, 3), (9, 11, 0), (12, 13, 3), (13, 22, 1), (24, 29, 2), (29, 30, 0)]
    assert runs.slots.dtype == torch.int32 and runs.slots.tolist() == SLOTS["runs"]
    assert not runs.is_empty and runs.single_slot is None and runs.max_slot == 3
    groups = runs.groups(torch.device("cpu"))
    assert [slot for slot, _ in groups] == [0, 1, 2, 3]
    assert groups[0][1].tolist() == [9, 10, 29] and groups[1][1] == slice(13, 22)
    assert groups[3][1].tolist() == [2, 3, 4, 5, 6, 7, 8, 12]
    tiles, table = runs.tile_table(4, torch.device("cpu"))
    assert tiles.tolist() == [[2, 6, 9, 12, 13, 17, 21, 24, 28, 29], [0, 0, 1, 2, 3, 3, 3, 4, 4, 5]]
    assert table.tolist() == [[9, 11, 13, 22, 29, 30], [3, 0, 3, 1, 2, 0]]
    assert LoRARuns.from_slots(torch.tensor([5, 5, 5])).single_slot == 5
    assert LoRARuns.from_slots([-1, -1]).is_empty and LoRARuns.from_slots([]).is_empty
    with pytest.raises(ValueError, match="-1"):
        LoRARuns.from_slots([0, -2])


def test_bad_arguments_are_refused():
    slots = SLOTS["runs"]
    x, a, b, _, y = make_case(slots, 72, 200, 16)
    runs = LoRARuns.from_slots(slots)
    with pytest.raises(ValueError, match="past the 3 slots"):
        lora_apply(x, a[:3], b[:3], runs, y)
    with pytest.raises(ValueError, match="x must be"):
        lora_apply(x[:-1], a, b, runs, y[:-1])
    with pytest.raises(ValueError, match="b must be"):
        lora_apply(x, a, b[:, :, :8], runs, y)
    with pytest.raises(ValueError, match="y must be"):
        lora_expand(lora_shrink(x, a, runs), b, runs, y.double())
    with pytest.raises(TypeError, match="LoRARuns"):
        lora_shrink(x, a, slots)


def _isa(flags):
    """lora_cpu.c: AVX-512F, else AVX2 + FMA, else the portable loops."""
    return "avx512" if "avx512f" in flags else "avx2" if {"avx2", "fma"} <= flags else "portable"


def test_the_native_kernel_reports_the_path_its_build_targets(kernel_path):
    assert lora_native_isa() == (_isa(target_flags()) if kernel_path == "native" else "none")


@pytest.mark.parametrize("march", ["x86-64-v3", "x86-64-v2"])
def test_the_kernel_tests_pass_on_the_other_builds(march):
    """The AVX2 + FMA build and the portable one (this CPU's own build: the tests above)."""
    if current_platform().native_march() != "native":
        pytest.skip("this process runs a fixed -march build already (the AVX2 cap pass or a build's subprocess)")
    missing = sorted(MARCH_FLAGS[march] - cpu_flags())
    if missing:
        pytest.skip(f"this CPU cannot run a -march={march} build: it lacks {', '.join(missing)}")
    env = dict(os.environ, SEQ2SEQ_ENGINE_NATIVE_MARCH=march)
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__, "-m",
                             "not gpu_kernel", "-k", "not other_builds"], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=600)
    summary = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else ""
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert " passed" in summary and "skipped" not in summary and "failed" not in summary, summary


@pytest.mark.gpu_kernel
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case, rank, dtype", [("runs", 8, torch.float32), ("runs", 48, torch.float32),
                                               ("single", 16, torch.bfloat16), ("decode", 48, torch.float16),
                                               ("runs", 192, torch.bfloat16)])
def test_triton_kernels_match_the_reference(device, case, rank, dtype):
    slots = SLOTS[case]
    x, a, b, wide, y = make_case(slots, 72, 200, rank, dtype=dtype, device=device, seed=rank)
    runs = LoRARuns.from_slots(torch.tensor(slots, device=device))
    expected, before = reference(x, a, b, slots, y), wide.clone()
    t = torch.zeros(len(slots), rank, dtype=torch.float32, device=device)
    triton_shrink(x, a, runs, t)
    triton_expand(t, b, runs, y)
    check(y, expected, before, wide, slots, dtype)
    if device == "cuda":  # the dispatch takes the Triton kernels where the CUDA platform chose them
        wide.copy_(before)
        lora_apply(x, a, b, runs, y)
        check(y, expected, before, wide, slots, dtype)


@pytest.mark.gpu_kernel
@pytest.mark.parametrize("dtype, rank", [("fp32", 48), ("bf16", 16), ("fp16", 192)])
def test_triton_kernels_compile_for_sm90(dtype, rank):
    """The GPU compiler takes what the interpreter ran (no GPU needed: test_triton_compile.py)."""
    from test_triton_compile import compile_for_h100

    constants = dict(BLOCK_M=triton_lora.BLOCK_ROWS, BLOCK_R=triton_lora._block_rank(rank),
                     PRECISION="ieee" if dtype == "fp32" else "tf32")
    tables = {"tile_ptr": "*i32", "seg_ptr": "*i32"}
    shrink = compile_for_h100(triton_lora._shrink_kernel,
                              {"x_ptr": f"*{dtype}", "a_ptr": f"*{dtype}", "t_ptr": "*fp32", **tables},
                              dict(constants, BLOCK_K=32))
    expand = compile_for_h100(triton_lora._expand_kernel,
                              {"t_ptr": "*fp32", "b_ptr": f"*{dtype}", "y_ptr": f"*{dtype}", **tables},
                              dict(constants, BLOCK_N=64))
    assert ".target sm_90" in shrink.asm["ptx"] and expand.asm["cubin"]
