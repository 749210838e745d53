"""The torch profiler side of profile_step.py --mode profile: labelled scopes and one step's time per category."""
from __future__ import annotations

import contextlib
import time

import seq2seq_engine  # noqa: F401,I001 - first: its OpenMP defaults must precede torch

# isort: split
import torch

from seq2seq_engine.attention.backends.torch_backend import TorchAttentionBackend
from seq2seq_engine.models.packed_linear import PackedLinear
from seq2seq_engine.sampling.sampler import Sampler
from seq2seq_engine.worker.model_runner import ModelRunner

SCOPES = {"attention": (TorchAttentionBackend, "forward"), "sampler": (Sampler, "forward"),
          "prepare_inputs": (ModelRunner, "prepare_inputs")}
LOGITS_ROWS = 30000          # a weight with more output rows than this is the logits projection
PACKED_FLOPS = [0]           # 2 * M * N * K of the packed linears called since the last reset


def _packed_forward(original):
    """PackedLinear.forward in a profiler label (its native kernel is a ctypes call, no aten::linear) that counts
    its FLOPs."""
    def forward(self, x, *args, **kwargs):
        PACKED_FLOPS[0] += 2 * (x.numel() // self.in_features) * self.in_features * self.out_features
        label = "scope::logits" if self.out_features > LOGITS_ROWS else "scope::linear"
        with torch.profiler.record_function(label):
            return original(self, x, *args, **kwargs)
    return forward


@contextlib.contextmanager
def labelled_scopes():
    """Wrap the engine's attention, sampler, input preparation and packed linears in profiler labels (for this
    script only)."""
    originals = {(PackedLinear, "forward"): PackedLinear.forward}
    PackedLinear.forward = _packed_forward(PackedLinear.forward)
    for label, (owner, name) in SCOPES.items():
        original = getattr(owner, name)
        originals[(owner, name)] = original

        def wrapped(*args, _original=original, _label=label, **kwargs):
            with torch.profiler.record_function(f"scope::{_label}"):
                return _original(*args, **kwargs)
        setattr(owner, name, wrapped)
    try:
        yield
    finally:
        for (owner, name), original in originals.items():
            setattr(owner, name, original)


def profile_one_step(engine) -> dict:
    """Per-category milliseconds of one engine.step()."""
    PACKED_FLOPS[0] = 0
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
        start = time.perf_counter()
        engine.step()
        wall = (time.perf_counter() - start) * 1e3
    events = prof.events()

    def total(name: str) -> float:
        return sum(e.cpu_time_total for e in events if e.name == name) / 1e3

    scoped = {label: total(f"scope::{label}") for label in SCOPES}
    # Top-level matmul ops outside the attention and packed-linear scopes: the unpacked layers' weights and logits.
    outer_ids = {e.id for e in events if e.name in ("scope::attention", "scope::linear", "scope::logits")}
    weight_matmuls = [e for e in events if e.name == "aten::linear" and not _inside(e, outer_ids)]
    is_logits = [len(e.input_shapes) > 1 and len(e.input_shapes[1]) == 2 and e.input_shapes[1][0] > LOGITS_ROWS
                 for e in weight_matmuls]
    logits = sum(e.cpu_time_total for e, lm in zip(weight_matmuls, is_logits) if lm) / 1e3 + total("scope::logits")
    matmul = sum(e.cpu_time_total for e in weight_matmuls) / 1e3 + total("scope::linear") + total("scope::logits")
    flops = sum(_linear_flops(e) for e in weight_matmuls) + PACKED_FLOPS[0]
    return {"wall": wall, "flops": flops, "linear (weights)": matmul - logits, "logits projection": logits,
            **scoped}


def _linear_flops(event) -> int:
    """2 * M * N * K of an aten::linear (input [..., K], weight [N, K])."""
    shapes = event.input_shapes
    if len(shapes) < 2 or not shapes[0] or len(shapes[1]) != 2:
        return 0
    rows = 1
    for dim in shapes[0][:-1]:
        rows *= dim
    return 2 * rows * shapes[1][0] * shapes[1][1]


def _inside(event, scope_ids) -> bool:
    parent = event.cpu_parent
    while parent is not None:
        if parent.id in scope_ids:
            return True
        parent = parent.cpu_parent
    return False


def matmul_rate_gflops(size: int = 2048) -> float:
    a, b = torch.randn(size, size), torch.randn(size, size)
    a @ b
    start = time.perf_counter()
    for _ in range(5):
        a @ b
    return 5 * 2 * size ** 3 / (time.perf_counter() - start) / 1e9


def print_profile(title: str, result: dict) -> None:
    wall = result.pop("wall")
    result.pop("flops")
    print(f"{title}: {wall:.1f} ms")
    accounted = 0.0
    for label, ms in result.items():
        accounted += ms
        print(f"  {label:18s} {ms:8.1f} ms  {ms / wall:6.1%}")
    print(f"  {'rest':18s} {wall - accounted:8.1f} ms  {(wall - accounted) / wall:6.1%}")
