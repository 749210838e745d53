"""Offline generation throughput: this engine vs HF transformers generate() vs CTranslate2, same weights, same
inputs, same output lengths, one command (each engine in its own child process; see common.py).

    .venv/bin/python benchmarks/throughput.py                          # bart and smollm2, greedy
    .venv/bin/python benchmarks/throughput.py --workload bart --beam 4
    .venv/bin/python benchmarks/throughput.py --workload smollm2 --engines ours,hf --rounds 3   # interleaved
    .venv/bin/python benchmarks/throughput.py --quick                  # smoke run, small sizes
"""
from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
from typing import List, Tuple

import seq2seq_engine  # noqa: F401,E402,I001 - first: its OpenMP defaults must precede torch

# isort: split
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import transformers  # noqa: E402
from common import (EngineRun, EngineSpec, add_timing_args, ct2_installed, print_run_header, run_rounds,  # noqa: E402
                    speed_table)
from gen_engines import GenJob, run_ct2, run_hf, run_ours  # noqa: E402
from text_models import convert_ct2, random_model  # noqa: E402

from seq2seq_engine.model_loader.resolver import resolve_model_path  # noqa: E402

FIRST_ID = 3  # random prompt ids avoid the special tokens (ids 0-2 in every random model: bos, pad, eos, unk)

# name: (requests, prompt length range, new tokens per request); --quick uses QUICK. marian: sentences of
# translation-test-set lengths; t5: summarization-length documents and summaries
FULL = {"bart": (64, (64, 1024), range(64, 143, 13)), "smollm2": (64, None, range(128, 129)),
        "decoder": (64, (32, 256), range(128, 129)), "marian": (256, (8, 64), range(8, 65, 4)),
        "t5": (32, (128, 512), range(32, 129, 16))}
QUICK = {"bart": (8, (32, 128), range(8, 17, 4)), "smollm2": (8, None, range(16, 17)),
         "decoder": (8, (16, 64), range(16, 17)), "marian": (8, (8, 24), range(4, 13, 4)),
         "t5": (8, (32, 96), range(8, 17, 4))}
# the HF-format random model of each workload (random_model's kinds)
MODEL_KINDS = {"bart": "bart", "decoder": "llama", "marian": "marian", "t5": "t5"}

TOPICS = ["photosynthesis", "the French Revolution", "black holes", "the water cycle", "compound interest",
          "the immune system", "volcanoes", "machine learning", "the Roman Empire", "climate change", "vaccines",
          "the stock market", "plate tectonics", "renewable energy", "the human heart", "the printing press"]
TEMPLATES = ["Explain {} in simple terms.", "Write a short paragraph about {}.",
             "What are three interesting facts about {}?", "Summarize the history of {} for a student."]


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", default="bart,smollm2",
                        help="comma list of bart, smollm2, decoder, marian (Marian-base / opus-mt shape), t5 "
                             "(Flan-T5-base shape)")
    parser.add_argument("--beam", type=int, default=1, help="beam width (1: greedy)")
    parser.add_argument("--engines", default="ours,hf,ct2", help="comma list of ours, hf, ct2")
    parser.add_argument("--ours-dtypes", default="float32,bfloat16",
                        help="comma list of float32, bfloat16, int8 (float32 with quantization='int8')")
    parser.add_argument("--ct2-dtypes", default="float32,int8")
    parser.add_argument("--num-prompts", type=int, default=0, help="override the workload's request count")
    parser.add_argument("--threads", type=int, default=2, help="torch threads and CT2 intra_threads")
    add_timing_args(parser)
    parser.add_argument("--no-warmup", action="store_true", help="skip the untimed 2-request warm-up")
    parser.add_argument("--hf-batch-size", type=int, default=-1,
                        help="documents per HF generate() call (0: all; default: 64 // beam)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--init-std", type=float, default=0.02,
                        help="std of the random weights (bart, decoder, marian; t5 scales its own init by std / 0.02)")
    parser.add_argument("--tie-lm-head", action="store_true",
                        help="random models tie the LM head to the embeddings, as BART-base and SmolLM2 do; then "
                             "their greedy outputs repeat one token (default: untied, same shapes and speed)")
    parser.add_argument("--quick", action="store_true", help="smoke run: 8 requests, short prompts and outputs")
    args = parser.parse_args(argv)
    if args.hf_batch_size < 0:
        args.hf_batch_size = 64 // args.beam
    return args


# ---------------------------------------------------------------------------------------------- inputs
def random_prompts(num: int, length_range: Tuple[int, int], vocab_size: int, rng: random.Random) -> List[List[int]]:
    """Random ids past the first special ones and below the last id (Marian's `<pad>`, absent from CT2's vocabulary)."""
    lo, hi = length_range
    return [[rng.randrange(FIRST_ID, vocab_size - 1) for _ in range(rng.randint(lo, hi))] for _ in range(num)]


def chat_prompts(model_dir: str, num: int) -> List[List[int]]:
    """`num` instructions (topics x templates, cycling) through the model's chat template, as token ids."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    texts = [TEMPLATES[i // len(TOPICS) % len(TEMPLATES)].format(TOPICS[i % len(TOPICS)]) for i in range(num)]
    return [list(tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                               tokenize=True, return_dict=False)) for text in texts]


def build_job(name: str, args: argparse.Namespace, tmp: str) -> GenJob:
    num, length_range, new_tokens = (QUICK if args.quick else FULL)[name]
    num = args.num_prompts or num
    rng = random.Random(args.seed)
    if name == "smollm2":
        model_dir = resolve_model_path("smollm2-135m")
        prompts = chat_prompts(model_dir, num)
    else:
        model_dir = random_model(MODEL_KINDS[name], args.seed, args.init_std, args.tie_lm_head, tmp)
        vocab_size = transformers.AutoConfig.from_pretrained(model_dir).vocab_size
        prompts = random_prompts(num, length_range, vocab_size, rng)
    config = transformers.AutoConfig.from_pretrained(model_dir)
    lengths = [rng.choice(new_tokens) for _ in prompts]
    enc_dec = bool(getattr(config, "is_encoder_decoder", False))
    return GenJob(model_dir=model_dir, enc_dec=enc_dec, prompts=prompts, lengths=lengths, beam=args.beam,
                  threads=args.threads, repeat=args.repeat, warmup=not args.no_warmup,
                  hf_batch_size=args.hf_batch_size, decoder_start=getattr(config, "decoder_start_token_id", None),
                  eos=config.eos_token_id, pad=config.pad_token_id)


# ---------------------------------------------------------------------------------------------- running
def run_workload(name: str, args: argparse.Namespace, tmp: str) -> Tuple[GenJob, List[EngineRun], List[str]]:
    job = build_job(name, args, os.path.join(tmp, name))
    engines = args.engines.split(",")
    specs: List[EngineSpec] = []
    for dtype in args.ours_dtypes.split(",") if "ours" in engines else []:
        specs.append(EngineSpec(f"ours {dtype}", run_ours, (job, dtype)))
    if "hf" in engines:
        specs.append(EngineSpec("hf float32", run_hf, (job,)))
    if "ct2" in engines and not ct2_installed():
        print("  ct2: ctranslate2 is not installed, skipped", flush=True)
    elif "ct2" in engines:
        job.ct2_dir = convert_ct2(job.model_dir, os.path.join(tmp, name))
        for compute_type in args.ct2_dtypes.split(","):
            specs.append(EngineSpec(f"ct2 {compute_type}", run_ct2, (job, compute_type)))
    failures: List[str] = []
    return job, run_rounds(specs, args.rounds, failures), failures


def print_report(name: str, job: GenJob, runs: List[EngineRun], failures: List[str]) -> None:
    mode = f"beam {job.beam}" if job.beam > 1 else "greedy"
    print(f"\n### {name} ({mode}): {len(job.prompts)} requests, {sum(map(len, job.prompts))} prompt tokens "
          f"(lengths {min(map(len, job.prompts))}-{max(map(len, job.prompts))}), {sum(job.lengths)} new tokens "
          f"forced (per request {min(job.lengths)}-{max(job.lengths)})")
    speed_table(runs, ["gen tokens"], lambda r: [str(sum(map(len, r.outputs)))], "tok/s",
                lambda r: sum(map(len, r.outputs)) / r.wall)
    for run in runs:
        wrong = sum(len(o) != n for o, n in zip(run.outputs, job.lengths))
        if wrong:
            print(f"WARNING: {run.label}: {wrong} of {len(job.lengths)} requests did not generate their target "
                  f"number of tokens")
    distinct = ", ".join(f"{r.label} {sum(len(set(o)) for o in r.outputs) / max(len(r.outputs), 1):.1f}"
                         for r in runs)
    print(f"mean distinct token ids per output (low: repetitive outputs, weak agreement evidence): {distinct}")
    if all(len(o) == n for run in runs for o, n in zip(run.outputs, job.lengths)):
        print("generated token counts: every engine produced exactly the target length for every request")
    for failure in failures:
        print(f"FAILED: {failure}")
    sys.stdout.flush()


def main(argv=None) -> int:
    args = parse_args(argv)
    print_run_header(args.threads)
    reports = []
    with tempfile.TemporaryDirectory(prefix="s2s_bench_") as tmp:
        for name in args.workload.split(","):
            if name not in FULL:
                raise SystemExit(f"unknown workload {name!r}: choose from {', '.join(FULL)}")
            print(f"[{name}]", flush=True)
            reports.append((name, *run_workload(name, args, tmp)))
    for report in reports:
        print_report(*report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
