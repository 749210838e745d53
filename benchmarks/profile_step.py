"""Where one engine step's time goes: the torch profiler's categories, plain step wall times, or its linears alone.

    .venv/bin/python -m benchmarks.profile_step                       # profile: BART-base shape, batch 64
    .venv/bin/python -m benchmarks.profile_step --workload decoder    # profile: SmolLM2-135M shape (random weights)
    .venv/bin/python -m benchmarks.profile_step --mode wall           # SmolLM2-135M, 64 chat prompts, 30 decode steps
    GOMP_SPINCOUNT=0 .venv/bin/python -m benchmarks.profile_step --mode wall   # the same under another setting
    .venv/bin/python -m benchmarks.profile_step --mode linears        # t5,marian,whisper; 1-256 rows; 5 rounds
    .venv/bin/python -m benchmarks.profile_step --mode linears --models t5 --rows 8,32,128 --rounds 9
    .venv/bin/python -m benchmarks.profile_step --mode wall --quick   # smoke run (every mode has one)

--mode profile: builds a random-weight model (HF `save_pretrained`, so the real loading code runs), admits
`--batch` requests, profiles the step that prefills them, runs `--decode-steps` decode steps until the batch is
steady, profiles one decode step, and prints the share of the step in: linear layers (matmuls of the weights),
attention (prefill SDPA and paged decode attention, cache writes), the logits projection, the sampler, input
preparation, and the rest; then the fraction of the measured fp32 matmul rate the decode step's linears reach.

--mode wall: no profiler; the wall time of the first (prefill) step and the median of `--decode-steps` decode steps
of `--model` on `--batch` chat prompts, all admitted at once. For A/B comparisons of settings that act when the
process starts (OpenMP variables, kernel switches): run the command once per setting, interleaved, several times
(docs/performance.md §3).

--mode linears: one decode step's float32 linears alone, in the decoder's order (self-attention q/k/v and output,
cross-attention query and output, feed-forward, per layer; then the logits head), a row per running sequence
(`--rows`), each weight its own tensor streamed from memory (`linear_kernels.py --cold` times the shapes one at a
time). `onednn` (PackedLinear on oneDNN's reordered weight) and `panels` (on the native panel kernel, when it built)
interleaved in every one of `--rounds` rounds; a cell is the fastest step; GB/s: the weight bytes over its time.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from typing import Dict, List, Tuple

import seq2seq_engine  # noqa: F401,I001 - first: its OpenMP defaults must precede torch

# isort: split
import torch

from benchmarks.lib.common import print_run_header
from benchmarks.lib.gen_workloads import chat_prompts
from benchmarks.lib.step_profiler import labelled_scopes, matmul_rate_gflops, print_profile, profile_one_step
from benchmarks.lib.text_models import random_model
from seq2seq_engine import LLM, SamplingParams, TokensPrompt
from seq2seq_engine.kernels.native_linear import panel_linear_available
from seq2seq_engine.model_loader.resolver import resolve_model_path
from seq2seq_engine.models.packed_linear import PackedLinear

# --mode linears: name: (layers, the (K, N) of one decoder layer's linears in the order they run, the head's (K, N))
DECODERS = {
    "t5": (12, [(768, 2304), (768, 768), (768, 768), (768, 768), (768, 4096), (2048, 768)], (768, 32128)),
    "marian": (6, [(512, 1536), (512, 512), (512, 512), (512, 512), (512, 2048), (2048, 512)], (512, 58101)),
    "whisper": (6, [(512, 1536), (512, 512), (512, 512), (512, 512), (512, 2048), (2048, 512)], (512, 51865)),
    "quick": (2, [(64, 192), (64, 64), (256, 64)], (64, 1000)),
}
# mode: what --quick sets, and --decode-steps' default
QUICK = {"profile": dict(batch=4, prompt_len=32, decode_steps=2), "wall": dict(batch=4, decode_steps=3),
         "linears": dict(models="quick", rows="1,9", rounds=1)}
DECODE_STEPS = {"profile": 8, "wall": 30, "linears": 0}


# ------------------------------------------------------------------------------------------- --mode profile
def run_profile(args: argparse.Namespace) -> int:
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


# ------------------------------------------------------------------------------------------- --mode wall
def run_wall(args: argparse.Namespace) -> int:
    model_dir = resolve_model_path(args.model)
    llm = LLM(model_dir, skip_tokenizer_init=True, dtype="float32", max_num_seqs=max(256, args.batch))
    engine = llm.llm_engine
    params = SamplingParams(temperature=0.0, max_tokens=args.decode_steps + 1, min_tokens=args.decode_steps + 1)
    for index, prompt in enumerate(chat_prompts(model_dir, args.batch)):
        engine.add_request(str(index), TokensPrompt(prompt_token_ids=prompt), params)
    times = []
    while engine.has_unfinished_requests():
        start = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - start)
    decode_ms = [t * 1e3 for t in times[1:]]
    print(f"{args.model}: {args.batch} prompts, threads {args.threads}, "
          f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', '-')} "
          f"GOMP_SPINCOUNT={os.environ.get('GOMP_SPINCOUNT', '-')}")
    print(f"prefill step: {times[0]:.3f} s")
    print(f"decode steps: median {statistics.median(decode_ms):.1f} ms, min {min(decode_ms):.1f}, "
          f"max {max(decode_ms):.1f} over {len(decode_ms)} steps")
    return 0


# ------------------------------------------------------------------------------------------- --mode linears
def step_shapes(model: str) -> List[Tuple[int, int]]:
    """(K, N) of every linear of one decode step of `model`, in order."""
    layers, per_layer, head = DECODERS[model]
    return per_layer * layers + [head]


def step_layers(model: str, panels: bool) -> List[PackedLinear]:
    """One decoder step's linears of `model` (random weights), packed for `panels` or oneDNN."""
    generator = torch.Generator().manual_seed(0)
    return [PackedLinear(torch.randn(n, k, generator=generator) * k ** -0.5, keep_weight=False, panels=panels)
            for k, n in step_shapes(model)]


def time_step(layers: List[PackedLinear], inputs: Dict[int, torch.Tensor]) -> float:
    start = time.perf_counter()
    for layer in layers:
        layer(inputs[layer.in_features])
    return time.perf_counter() - start


def measure(model: str, rows: List[int], rounds: int, candidates: Tuple[str, ...]) -> Dict[Tuple[str, int], float]:
    """Fastest step time per (candidate, rows), the candidates interleaved in every round."""
    steps = {name: step_layers(model, name == "panels") for name in candidates}
    best: Dict[Tuple[str, int], float] = {}
    for count in rows:
        inputs = {k: torch.randn(count, k) for k in {layer.in_features for layer in steps[candidates[0]]}}
        for name in candidates:                                  # untimed: first calls build and page in
            time_step(steps[name], inputs)
        for _ in range(rounds):
            for name in candidates:
                seconds = time_step(steps[name], inputs)
                best[name, count] = min(best.get((name, count), float("inf")), seconds)
    return best


def run_linears(args: argparse.Namespace) -> int:
    candidates = ("onednn", "panels") if panel_linear_available() else ("onednn",)
    if len(candidates) == 1:
        print("panels skipped: the native panel kernel is not available here (AVX-512F and a C compiler)")
    rows = [int(value) for value in args.rows.split(",")]
    for model in args.models.split(","):
        if model not in DECODERS:
            raise SystemExit(f"unknown model {model!r}: choose from {', '.join(DECODERS)}")
        weight_bytes = sum(k * n * 4 for k, n in step_shapes(model))
        best = measure(model, rows, args.rounds, candidates)
        print(f"\n### {model}: one decode step's linears ({weight_bytes / 1e6:.0f} MB of float32 weights)")
        print("| rows | " + " | ".join(f"{name} ms | {name} GB/s" for name in candidates) + " | panels / onednn |")
        print("|---|" + "---|---|" * len(candidates) + "---|")
        for count in rows:
            cells = [f"{best[name, count] * 1e3:.3f} | {weight_bytes / best[name, count] / 1e9:.1f}"
                     for name in candidates]
            ratio = f"{best['panels', count] / best['onednn', count]:.2f}" if "panels" in candidates else ""
            print(f"| {count} | " + " | ".join(cells) + f" | {ratio} |", flush=True)
    return 0


MODES = {"profile": run_profile, "wall": run_wall, "linears": run_linears}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=sorted(MODES), default="profile")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="smoke run: profile 4 requests of 32 tokens, 2 decode "
                        "steps; wall 4 prompts, 3 decode steps; linears a small decoder, 1 and 9 rows, one round")
    group = parser.add_argument_group("profile and wall")
    group.add_argument("--batch", "--prompts", dest="batch", type=int, default=64, help="requests admitted at once")
    group.add_argument("--decode-steps", "--steps", dest="decode_steps", type=int, default=None,
                       help="profile: decode steps before the profiled one (default 8); wall: decode steps timed "
                            "after the prefill step (default 30)")
    group.add_argument("--workload", choices=["bart", "decoder"], default="bart", help="profile: the random model")
    group.add_argument("--prompt-len", type=int, default=256, help="profile: prompt tokens per request")
    group.add_argument("--model", default="smollm2-135m", help="wall: the model (a name or a directory)")
    group = parser.add_argument_group("linears")
    group.add_argument("--models", default="t5,marian,whisper", help=f"comma list of {', '.join(DECODERS)}")
    group.add_argument("--rows", default="1,4,8,16,32,64,128,256", help="comma list of rows (running sequences)")
    group.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    if args.decode_steps is None:
        args.decode_steps = DECODE_STEPS[args.mode]
    if args.quick:
        vars(args).update(QUICK[args.mode])
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    print_run_header(args.threads)
    return MODES[args.mode](args)


if __name__ == "__main__":
    sys.exit(main())
