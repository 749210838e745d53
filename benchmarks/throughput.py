"""Offline throughput: the same greedy workload through seq2seq_engine's LLM and HF transformers' generate()."""
from __future__ import annotations

import argparse
import gc
import random
import sys
import tempfile
import time
from typing import Dict, List, Tuple

import seq2seq_engine  # noqa: F401,I001 - first: its OpenMP defaults must precede torch, for every engine run here
import torch
import transformers

from seq2seq_engine.entrypoints.llm import LLM
from seq2seq_engine.inputs.data import ExplicitEncoderDecoderPrompt, TokensPrompt
from seq2seq_engine.sampling_params import SamplingParams

FIRST_ID = 3  # random prompt ids avoid the special tokens 0 (bos), 1 (pad), 2 (eos / decoder start)

LABELS = {"ours": "seq2seq_engine", "hf": "hf-generate"}

WORKLOADS = {
    # name: (prompt length range, model builder name)
    "bart": ((64, 512), "bart"),
    "decoder": ((32, 256), "llama"),
}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workload", choices=["bart", "decoder", "all"], default="all")
    parser.add_argument("--num-prompts", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--hf-batch-size", type=int, default=0, help="HF generate() batch size (0 = all at once)")
    parser.add_argument("--init-std", type=float, default=0.02,
                        help="std of the random weights (0.02 = HF default; 0.2 makes the decoder-only outputs "
                             "non-repetitive)")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--max-num-seqs", type=int, default=256)
    parser.add_argument("--kv-cache-space-gb", type=float, default=2.0)
    parser.add_argument("--repeat", type=int, default=1, help="timed runs per engine; the fastest is reported")
    parser.add_argument("--no-warmup", action="store_true", help="skip the short untimed warm-up runs")
    parser.add_argument("--skip-hf", action="store_true", help="time only this engine")
    parser.add_argument("--skip-engine", action="store_true", help="time only HF transformers")
    parser.add_argument("--hf-eos-mode", choices=["min-new-tokens", "ignore"], default="min-new-tokens",
                        help="min-new-tokens: HF masks EOS until max_new_tokens (min_new_tokens=max_new_tokens); "
                             "ignore: HF gets eos_token_id=None, so EOS may be generated and does not stop")
    parser.add_argument("--quick", action="store_true", help="smoke run: 8 prompts, 16 new tokens")
    args = parser.parse_args(argv)
    if args.quick:
        args.num_prompts, args.max_new_tokens = 8, 16
    return args


def build_model(kind: str, seed: int, out_dir: str, init_std: float = 0.02) -> Tuple[str, torch.nn.Module]:
    """Random-init a BART-base-shaped or SmolLM2-135M-shaped model with a fixed seed; save_pretrained it."""
    torch.manual_seed(seed)
    if kind == "bart":
        config = transformers.BartConfig(d_model=768, encoder_layers=6, decoder_layers=6,
                                         encoder_attention_heads=12, decoder_attention_heads=12,
                                         encoder_ffn_dim=3072, decoder_ffn_dim=3072, vocab_size=50265,
                                         max_position_embeddings=1024, forced_bos_token_id=None,
                                         forced_eos_token_id=None, init_std=init_std)
        model = transformers.BartForConditionalGeneration(config)
    else:
        config = transformers.LlamaConfig(hidden_size=576, num_hidden_layers=30, num_attention_heads=9,
                                          num_key_value_heads=3, intermediate_size=1536, vocab_size=49152,
                                          tie_word_embeddings=True, max_position_embeddings=8192,
                                          rope_theta=100000.0, rms_norm_eps=1e-5,
                                          initializer_range=init_std, bos_token_id=0, eos_token_id=2, pad_token_id=1)
        model = transformers.LlamaForCausalLM(config)
    model = model.eval()
    model_dir = f"{out_dir}/{kind}"
    model.save_pretrained(model_dir)
    return model_dir, model


def make_prompts(num: int, length_range: Tuple[int, int], vocab_size: int, seed: int) -> List[List[int]]:
    rng = random.Random(seed)
    lo, hi = length_range
    return [[rng.randrange(FIRST_ID, vocab_size) for _ in range(rng.randint(lo, hi))] for _ in range(num)]


def run_engine(llm: LLM, prompts: List[List[int]], max_new: int, enc_dec: bool,
               decoder_start: int) -> Tuple[float, List[List[int]]]:
    """Greedy, exactly `max_new` tokens per request (min_tokens = max_tokens, ignore_eos)."""
    params = SamplingParams(temperature=0.0, max_tokens=max_new, min_tokens=max_new, ignore_eos=True)
    if enc_dec:
        inputs = [ExplicitEncoderDecoderPrompt(encoder_prompt=TokensPrompt(prompt_token_ids=p),
                                               decoder_prompt=TokensPrompt(prompt_token_ids=[decoder_start]))
                  for p in prompts]
    else:
        inputs = [TokensPrompt(prompt_token_ids=p) for p in prompts]
    start = time.perf_counter()
    outputs = llm.generate(inputs, params, use_tqdm=False)
    seconds = time.perf_counter() - start
    return seconds, [list(o.outputs[0].token_ids) for o in outputs]


def pad_batch(prompts: List[List[int]], pad_id: int, left: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, p in enumerate(prompts):
        cols = slice(width - len(p), width) if left else slice(0, len(p))
        ids[row, cols] = torch.tensor(p)
        mask[row, cols] = 1
    return ids, mask


def run_hf(model, prompts: List[List[int]], max_new: int, enc_dec: bool, batch_size: int,
           eos_mode: str = "min-new-tokens") -> Tuple[float, List[List[int]]]:
    """HF generate(): padded batches (right padding for the encoder, left for decoder-only), greedy."""
    config = model.config
    # A fresh generation config: no no_repeat_ngram_size, forced bos/eos or beams from model defaults.
    eos = config.eos_token_id if eos_mode == "min-new-tokens" else None
    model.generation_config = transformers.GenerationConfig(
        bos_token_id=config.bos_token_id, eos_token_id=eos, pad_token_id=config.pad_token_id,
        decoder_start_token_id=getattr(config, "decoder_start_token_id", None))
    gen_kwargs = dict(max_new_tokens=max_new, min_new_tokens=max_new if eos is not None else None,
                      do_sample=False, num_beams=1, no_repeat_ngram_size=0, forced_bos_token_id=None,
                      forced_eos_token_id=None)
    batch_size = batch_size or len(prompts)
    results: List[List[int]] = []
    start = time.perf_counter()
    with torch.inference_mode():
        for first in range(0, len(prompts), batch_size):
            chunk = prompts[first:first + batch_size]
            ids, mask = pad_batch(chunk, config.pad_token_id, left=not enc_dec)
            sequences = model.generate(input_ids=ids, attention_mask=mask, **gen_kwargs)
            skip = 1 if enc_dec else ids.shape[1]  # decoder start token / the padded prompt
            results.extend(row[skip:].tolist() for row in sequences)
    seconds = time.perf_counter() - start
    return seconds, results


def agreement(ours: List[List[int]], theirs: List[List[int]]) -> Tuple[float, float]:
    """(fraction of requests with identical token ids, mean fraction of the common prefix)."""
    same = sum(a == b for a, b in zip(ours, theirs))
    prefix = []
    for a, b in zip(ours, theirs):
        n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        prefix.append(n / max(len(a), len(b), 1))
    return same / max(len(ours), 1), sum(prefix) / max(len(prefix), 1)


def run_workload(name: str, args: argparse.Namespace, tmp: str) -> Dict[str, object]:
    """Build the model, warm both engines up, time both on the same prompts (interleaved), compare tokens."""
    length_range, kind = WORKLOADS[name]
    enc_dec = kind == "bart"
    model_dir, model = build_model(kind, args.seed, tmp, args.init_std)
    prompts = make_prompts(args.num_prompts, length_range, model.config.vocab_size, args.seed + 1)
    decoder_start = getattr(model.config, "decoder_start_token_id", None)
    row: Dict[str, object] = {"workload": name, "prompts": len(prompts), "eos": model.config.eos_token_id,
                              "hf_eos_mode": args.hf_eos_mode,
                              "prompt_tokens": sum(map(len, prompts)), "new": args.max_new_tokens}
    runners = {}
    if not args.skip_engine:
        llm = LLM(model_dir, skip_tokenizer_init=True, dtype=args.dtype, block_size=args.block_size,
                  max_num_seqs=args.max_num_seqs, kv_cache_space_gb=args.kv_cache_space_gb, seed=args.seed)
        runners["ours"] = lambda batch, new: run_engine(llm, batch, new, enc_dec, decoder_start)
    if not args.skip_hf:
        runners["hf"] = lambda batch, new: run_hf(model, batch, new, enc_dec, args.hf_batch_size, args.hf_eos_mode)
    if not args.no_warmup:
        for runner in runners.values():
            runner(prompts[:2], 2)
    for attempt in range(args.repeat):  # interleaved, so load changes on a shared machine hit both alike
        for key, runner in runners.items():
            result = runner(prompts, args.max_new_tokens)
            print(f"[{name}] run {attempt + 1}: {LABELS[key]} {result[0]:.2f} s", flush=True)
            if key not in row or result[0] < row[key][0]:
                row[key] = result
    runners.clear()
    gc.collect()
    return row


def print_table(rows: List[Dict[str, object]]) -> None:
    header = f"{'workload':<9} {'engine':<14} {'wall_s':>8} {'gen_tokens':>10} {'tok/s':>8} {'HF/ours':>8}"
    print("\n" + header + "\n" + "-" * len(header))
    for row in rows:
        for key in ("ours", "hf"):
            if key not in row:
                continue
            seconds, outputs = row[key]
            tokens = sum(map(len, outputs))
            ratio = f"{row['hf'][0] / seconds:.2f}x" if key == "ours" and "hf" in row else ""
            print(f"{row['workload']:<9} {LABELS[key]:<14} {seconds:>8.2f} {tokens:>10d} {tokens / seconds:>8.1f} "
                  f"{ratio:>8}")
    print()
    for row in rows:
        print_agreement(row)


def print_agreement(row: Dict[str, object]) -> None:
    """Prompt stats, token agreement with HF, output diversity, and a hint when EOS masking differs."""
    keys = [k for k in ("ours", "hf") if k in row]
    diverse = {k: sum(len(set(o)) for o in row[k][1]) / max(len(row[k][1]), 1) for k in keys}
    desc = f"{row['workload']}: {row['prompts']} prompts, {row['prompt_tokens']} prompt tokens, {row['new']} new"
    if len(keys) == 2:
        exact, prefix = agreement(row["ours"][1], row["hf"][1])
        desc += f"; token agreement with HF: {exact:.0%} of requests identical, mean common prefix {prefix:.1%}"
    desc += "; mean distinct tokens per output: " + ", ".join(f"{k} {v:.1f}" for k, v in diverse.items())
    print(desc)
    with_eos = sum(row["eos"] in o for o in row["ours"][1]) if "ours" in row else 0
    if with_eos and "hf" in row and row["hf_eos_mode"] == "min-new-tokens":
        print(f"  note: {with_eos} of our outputs contain EOS ({row['eos']}): this engine's min_tokens does not mask "
              f"EOS logits, HF's min_new_tokens does; --hf-eos-mode ignore compares like for like.")


def main(argv=None) -> None:
    args = parse_args(argv)
    print(f"args: {vars(args)}")
    print(f"argv: {' '.join(sys.argv)}")
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, "
          f"threads {torch.get_num_threads()}")
    names = ["bart", "decoder"] if args.workload == "all" else [args.workload]
    rows = []
    with tempfile.TemporaryDirectory(prefix="s2s_bench_") as tmp:
        for name in names:
            rows.append(run_workload(name, args, tmp))
    print_table(rows)


if __name__ == "__main__":
    main()
