"""Load test: many requests of mixed lengths through a KV pool sized to a fraction of their total need.

Runs the same requests twice in one process, on a random-initialised model saved in HF format:
  * unconstrained: a KV pool that holds every request at its full length at once;
  * constrained:   a pool of `--pool-fraction` of that need (default a quarter), so the scheduler must preempt.
Checks that the outputs are identical, that every KV block is back in the free pools at the end, and prints the
throughput ratio and the preemption counts.

    .venv/bin/python -m benchmarks.load_test                        # 1000 requests, decoder-only (Llama-shaped)
    .venv/bin/python -m benchmarks.load_test --arch bart            # encoder/decoder (BART-shaped)
    .venv/bin/python -m benchmarks.load_test --preemption-mode swap
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from typing import List, Tuple

import seq2seq_engine  # noqa: F401,I001 - first: its OpenMP defaults must precede torch, for every engine run here

# isort: split
import torch
import transformers

from seq2seq_engine import LLM, SamplingParams, TokensPrompt

_CONFIGS = {
    "llama": lambda: transformers.LlamaConfig(
        vocab_size=2048, hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=8,
        num_key_value_heads=4, max_position_embeddings=1024, initializer_range=0.1, pad_token_id=1, bos_token_id=0,
        eos_token_id=2),
    "bart": lambda: transformers.BartConfig(
        vocab_size=2048, d_model=256, encoder_layers=3, decoder_layers=3, encoder_attention_heads=8,
        decoder_attention_heads=8, encoder_ffn_dim=512, decoder_ffn_dim=512, max_position_embeddings=1024,
        init_std=0.1, pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2,
        forced_bos_token_id=None),
}
_CLASSES = {"llama": transformers.LlamaForCausalLM, "bart": transformers.BartForConditionalGeneration}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", choices=sorted(_CONFIGS), default="llama")
    parser.add_argument("--num-requests", type=int, default=1000)
    parser.add_argument("--min-prompt", type=int, default=8)
    parser.add_argument("--max-prompt", type=int, default=256)
    parser.add_argument("--min-new", type=int, default=8)
    parser.add_argument("--max-new", type=int, default=128)
    parser.add_argument("--pool-fraction", type=float, default=0.25,
                        help="constrained KV pool as a fraction of the blocks all requests need at full length")
    parser.add_argument("--preemption-mode", choices=["recompute", "swap"], default="recompute")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--max-num-seqs", type=int, default=256)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--min-ratio", type=float, default=0.8,
                        help="exit 1 when constrained throughput / unconstrained is below this (0: do not check)")
    return parser.parse_args(argv)


def build_model(arch: str, directory: str) -> str:
    torch.manual_seed(0)
    model = _CLASSES[arch](_CONFIGS[arch]()).eval()
    path = os.path.join(directory, arch)
    model.save_pretrained(path)
    return path


def make_requests(args) -> List[Tuple[List[int], int]]:
    """(prompt token ids, new tokens) per request; lengths uniform in the given ranges."""
    generator = torch.Generator().manual_seed(args.seed)
    vocab = _CONFIGS[args.arch]().vocab_size
    requests = []
    for _ in range(args.num_requests):
        prompt_len = int(torch.randint(args.min_prompt, args.max_prompt + 1, (1,), generator=generator))
        new_tokens = int(torch.randint(args.min_new, args.max_new + 1, (1,), generator=generator))
        prompt = torch.randint(3, vocab, (prompt_len,), generator=generator).tolist()
        requests.append((prompt, new_tokens))
    return requests


def blocks_needed(requests, block_size: int, encoder_decoder: bool) -> int:
    """KV blocks for every request at its full length: decoder self blocks (+ one cross table per request)."""
    total = 0
    for prompt, new_tokens in requests:
        decoder_len = (2 if encoder_decoder else len(prompt)) + new_tokens
        total += -(-decoder_len // block_size)
        if encoder_decoder:
            total += -(-len(prompt) // block_size)
    return total


def run(model_dir: str, requests, num_blocks: int, args) -> dict:
    llm = LLM(model_dir, dtype="float32", skip_tokenizer_init=True, block_size=args.block_size,
              max_num_seqs=args.max_num_seqs, num_gpu_blocks_override=num_blocks, swap_space_gb=4.0,
              preemption_mode=args.preemption_mode, seed=args.seed)
    prompts = [TokensPrompt(prompt_token_ids=prompt) for prompt, _ in requests]
    params = [SamplingParams(temperature=0.0, max_tokens=n, min_tokens=n, ignore_eos=True) for _, n in requests]
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=True)
    wall = time.perf_counter() - start
    engine = llm.llm_engine
    manager = engine.scheduler.block_manager
    return {
        "wall": wall,
        "tokens": [out.outputs[0].token_ids for out in outputs],
        "preemptions": engine.scheduler.num_cumulative_preemption,
        "free_gpu": manager.get_num_free_gpu_blocks(), "num_gpu": engine.cache_config.num_gpu_blocks,
        "free_cpu": manager.get_num_free_cpu_blocks(), "num_cpu": engine.cache_config.num_cpu_blocks,
    }


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    encoder_decoder = args.arch == "bart"
    requests = make_requests(args)
    need = blocks_needed(requests, args.block_size, encoder_decoder)
    constrained_blocks = max(1, int(need * args.pool_fraction))
    generated = sum(n for _, n in requests)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_model(args.arch, tmp)
        print(f"arch={args.arch} requests={len(requests)} prompt {args.min_prompt}-{args.max_prompt} new "
              f"{args.min_new}-{args.max_new} tokens, block_size={args.block_size}, max_num_seqs="
              f"{args.max_num_seqs}, preemption={args.preemption_mode}; blocks for all at full length: {need}",
              flush=True)
        full = run(model_dir, requests, need, args)
        small = run(model_dir, requests, constrained_blocks, args)
    identical = sum(a == b for a, b in zip(full["tokens"], small["tokens"]))
    print("| run | KV blocks | wall s | generated tok/s | preemptions | blocks back (gpu, cpu) |")
    print("|---|---|---|---|---|---|")
    for name, result, blocks in (("unconstrained", full, need), ("constrained", small, constrained_blocks)):
        back = f"{result['free_gpu']}/{result['num_gpu']}, {result['free_cpu']}/{result['num_cpu']}"
        print(f"| {name} | {blocks} | {result['wall']:.2f} | {generated / result['wall']:.1f} | "
              f"{result['preemptions']} | {back} |")
    ratio = full["wall"] / small["wall"]
    all_back = all(r["free_gpu"] == r["num_gpu"] and r["free_cpu"] == r["num_cpu"] for r in (full, small))
    print(f"identical outputs: {identical}/{len(requests)}; constrained throughput = {ratio:.2f}x unconstrained; "
          f"all blocks returned: {all_back}")
    return 0 if identical == len(requests) and all_back and ratio >= args.min_ratio else 1


if __name__ == "__main__":
    sys.exit(main())
