"""Wall time of engine steps, no profiler: the first (prefill) step and the median decode step of a batch.

    .venv/bin/python benchmarks/step_times.py                 # SmolLM2-135M, 64 chat prompts, 30 decode steps
    GOMP_SPINCOUNT=0 .venv/bin/python benchmarks/step_times.py   # the same under another OpenMP setting

Used for A/B comparisons of settings that act when the process starts (OpenMP variables, kernel switches): run
the command once per setting, interleaved, several times (docs/performance.md §3). Every request is admitted at
once, so the first step prefills the whole batch (when the step budget holds it) and the later steps decode it.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import seq2seq_engine  # noqa: F401,I001 - first: its OpenMP defaults must precede torch

# isort: split
import torch

from seq2seq_engine import LLM, SamplingParams, TokensPrompt
from seq2seq_engine.model_loader.resolver import resolve_model_path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from throughput import chat_prompts  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--steps", type=int, default=30, help="decode steps timed after the prefill step")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="smoke run: 4 prompts, 3 decode steps")
    args = parser.parse_args(argv)
    if args.quick:
        args.prompts, args.steps = 4, 3
    torch.set_num_threads(args.threads)
    model_dir = resolve_model_path(args.model)
    llm = LLM(model_dir, skip_tokenizer_init=True, dtype="float32", max_num_seqs=max(256, args.prompts))
    engine = llm.llm_engine
    params = SamplingParams(temperature=0.0, max_tokens=args.steps + 1, min_tokens=args.steps + 1)
    for index, prompt in enumerate(chat_prompts(model_dir, args.prompts)):
        engine.add_request(str(index), TokensPrompt(prompt_token_ids=prompt), params)
    times = []
    while engine.has_unfinished_requests():
        start = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - start)
    decode_ms = [t * 1e3 for t in times[1:]]
    print(f"{args.model}: {args.prompts} prompts, threads {args.threads}, "
          f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', '-')} "
          f"GOMP_SPINCOUNT={os.environ.get('GOMP_SPINCOUNT', '-')}")
    print(f"prefill step: {times[0]:.3f} s")
    print(f"decode steps: median {statistics.median(decode_ms):.1f} ms, min {min(decode_ms):.1f}, "
          f"max {max(decode_ms):.1f} over {len(decode_ms)} steps")
    return 0


if __name__ == "__main__":
    sys.exit(main())
