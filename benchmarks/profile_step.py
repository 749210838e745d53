"""Where one engine step spends its time: torch profiler over one prefill step and one steady decode step.

    .venv/bin/python benchmarks/profile_step.py                       # BART-base shape, batch 64
    .venv/bin/python benchmarks/profile_step.py --workload decoder    # SmolLM2-135M shape (random weights)

Builds a random-weight model (HF `save_pretrained`, so the real loading code runs), admits `--batch` requests,
profiles the step that prefills them, runs decode steps until the batch is steady, profiles one decode step, and
prints the share of the step in: linear layers (matmuls of the weights), attention (prefill SDPA and paged decode
attention, cache writes), the logits projection, the sampler, input preparation, and the rest. It also prints the
fraction of the measured fp32 matmul rate that the decode step's linear layers reach.
"""
from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
import time

import seq2seq_engine  # noqa: F401,I001 - first: its OpenMP defaults must precede torch

# isort: split
import torch

from seq2seq_engine import LLM, SamplingParams, TokensPrompt
from seq2seq_engine.attention.backends.torch_backend import TorchAttentionBackend
from seq2seq_engine.sampling.sampler import Sampler
from seq2seq_engine.worker.model_runner import ModelRunner

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from text_models import random_model  # noqa: E402

SCOPES = {"attention": (TorchAttentionBackend, "forward"), "sampler": (Sampler, "forward"),
          "prepare_inputs": (ModelRunner, "prepare_inputs")}


@contextlib.contextmanager
def labelled_scopes():
    """Wrap the engine's attention, sampler and input preparation in profiler labels (for this script only)."""
    originals = {}
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
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
        start = time.perf_counter()
        engine.step()
        wall = (time.perf_counter() - start) * 1e3
    events = prof.events()
    scoped = {label: sum(e.cpu_time_total for e in events if e.name == f"scope::{label}") / 1e3 for label in SCOPES}
    # Top-level matmul ops outside the attention scope: the layers' weights and the logits projection.
    attention_ids = {e.id for e in events if e.name == "scope::attention"}
    weight_matmuls = [e for e in events if e.name == "aten::linear" and not _inside(e, attention_ids)]
    is_logits = [len(e.input_shapes) > 1 and len(e.input_shapes[1]) == 2 and e.input_shapes[1][0] > 30000
                 for e in weight_matmuls]
    logits = sum(e.cpu_time_total for e, lm in zip(weight_matmuls, is_logits) if lm) / 1e3
    matmul = sum(e.cpu_time_total for e in weight_matmuls) / 1e3
    flops = sum(_linear_flops(e) for e in weight_matmuls)
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


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", choices=["bart", "decoder"], default="bart")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--prompt-len", type=int, default=256)
    parser.add_argument("--decode-steps", type=int, default=8, help="decode steps before the profiled one")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = random_model(args.workload, 0, 0.02, True, tmp)
        vocab = 50265 if args.workload == "bart" else 49152
        llm = LLM(model_dir, skip_tokenizer_init=True, kv_cache_space_gb=2.0, max_num_seqs=max(256, args.batch))
        engine = llm.llm_engine
        generator = torch.Generator().manual_seed(0)
        params = SamplingParams(temperature=0.0, max_tokens=64, min_tokens=64, ignore_eos=True)
        # Warm-up: a first request run to the end (the first steps import and allocate lazily).
        llm.generate(TokensPrompt(prompt_token_ids=[5] * 8), SamplingParams(max_tokens=2), use_tqdm=False)
        for i in range(args.batch):
            prompt = torch.randint(3, vocab, (args.prompt_len,), generator=generator).tolist()
            engine.add_request(str(i), TokensPrompt(prompt_token_ids=prompt), params)
        with labelled_scopes():
            budget = engine.scheduler_config.max_num_batched_tokens
            first_step_tokens = min(args.batch * args.prompt_len, budget // args.prompt_len * args.prompt_len)
            print_profile(f"first prefill step ({first_step_tokens} of the {args.batch} x {args.prompt_len} prompt "
                          f"tokens; step budget {budget})", profile_one_step(engine))
            for _ in range(args.decode_steps):
                engine.step()
            decode = profile_one_step(engine)
        flops = decode["flops"]
        rate = matmul_rate_gflops()
        achieved = flops / (decode["linear (weights)"] + decode["logits projection"]) / 1e6
        print_profile(f"decode step (batch {args.batch})", decode)
    print(f"decode linear layers + logits: {flops / 1e9:.2f} GFLOP at {achieved:.1f} GFLOP/s = "
          f"{achieved / rate:.0%} of the measured {rate:.1f} GFLOP/s fp32 matmul rate (2048^2)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
