"""Offline generation throughput: this engine vs HF transformers generate() vs CTranslate2, same weights, same
inputs, same output lengths, one command (each engine in its own child process; see common.py).

    .venv/bin/python benchmarks/throughput.py                          # bart and smollm2, greedy
    .venv/bin/python benchmarks/throughput.py --workload bart --beam 4
    .venv/bin/python benchmarks/throughput.py --workload smollm2 --engines ours,hf --rounds 3   # interleaved
    .venv/bin/python benchmarks/throughput.py --quick                  # smoke run, small sizes
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
from typing import List, Tuple

import seq2seq_engine  # noqa: F401,E402,I001 - first: its OpenMP defaults must precede torch

# isort: split
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402
import transformers  # noqa: E402
from common import (EngineRun, EngineSpec, add_timing_args, ct2_installed, print_run_header, run_rounds,  # noqa: E402
                    speed_table)
from gen_engines import GenJob, run_ct2, run_hf, run_ours  # noqa: E402

from seq2seq_engine.model_loader.resolver import resolve_model_path  # noqa: E402

FIRST_ID = 3  # random prompt ids avoid the special tokens 0 (bos), 1 (pad), 2 (eos / decoder start)

# name: (requests, prompt length range, new tokens per request); --quick uses QUICK
FULL = {"bart": (64, (64, 1024), range(64, 143, 13)), "smollm2": (64, None, range(128, 129)),
        "decoder": (64, (32, 256), range(128, 129))}
QUICK = {"bart": (8, (32, 128), range(8, 17, 4)), "smollm2": (8, None, range(16, 17)),
         "decoder": (8, (16, 64), range(16, 17))}

TOPICS = ["photosynthesis", "the French Revolution", "black holes", "the water cycle", "compound interest",
          "the immune system", "volcanoes", "machine learning", "the Roman Empire", "climate change", "vaccines",
          "the stock market", "plate tectonics", "renewable energy", "the human heart", "the printing press"]
TEMPLATES = ["Explain {} in simple terms.", "Write a short paragraph about {}.",
             "What are three interesting facts about {}?", "Summarize the history of {} for a student."]


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", default="bart,smollm2", help="comma list of bart, smollm2, decoder")
    parser.add_argument("--beam", type=int, default=1, help="beam width (1: greedy)")
    parser.add_argument("--engines", default="ours,hf,ct2", help="comma list of ours, hf, ct2")
    parser.add_argument("--ours-dtypes", default="float32,bfloat16")
    parser.add_argument("--ct2-dtypes", default="float32,int8")
    parser.add_argument("--num-prompts", type=int, default=0, help="override the workload's request count")
    parser.add_argument("--threads", type=int, default=2, help="torch threads and CT2 intra_threads")
    add_timing_args(parser)
    parser.add_argument("--no-warmup", action="store_true", help="skip the untimed 2-request warm-up")
    parser.add_argument("--hf-batch-size", type=int, default=-1,
                        help="documents per HF generate() call (0: all; default: 64 // beam)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--init-std", type=float, default=0.02,
                        help="std of the random weights (bart, decoder)")
    parser.add_argument("--tie-lm-head", action="store_true",
                        help="random models tie the LM head to the embeddings, as BART-base and SmolLM2 do; then "
                             "their greedy outputs repeat one token (default: untied, same shapes and speed)")
    parser.add_argument("--quick", action="store_true", help="smoke run: 8 requests, short prompts and outputs")
    args = parser.parse_args(argv)
    if args.hf_batch_size < 0:
        args.hf_batch_size = 64 // args.beam
    return args


# ---------------------------------------------------------------------------------------------- models
def random_model(kind: str, seed: int, init_std: float, tie: bool, out_dir: str) -> str:
    """A BART-base-shaped or SmolLM2-135M-shaped model with random weights (fixed seed), saved in HF format.
    Tied to the embeddings, a random LM head's argmax is the input token itself (the residual stream dominates),
    so every output repeats one token; an untied one (same matmul shapes) gives varied outputs."""
    torch.manual_seed(seed)
    if kind == "bart":
        config = transformers.BartConfig(d_model=768, encoder_layers=6, decoder_layers=6, encoder_attention_heads=12,
                                         decoder_attention_heads=12, encoder_ffn_dim=3072, decoder_ffn_dim=3072,
                                         vocab_size=50265, max_position_embeddings=1024, forced_bos_token_id=None,
                                         forced_eos_token_id=None, init_std=init_std, tie_word_embeddings=tie)
        model = transformers.BartForConditionalGeneration(config)
    else:
        config = transformers.LlamaConfig(hidden_size=576, num_hidden_layers=30, num_attention_heads=9,
                                          num_key_value_heads=3, intermediate_size=1536, vocab_size=49152,
                                          tie_word_embeddings=tie, max_position_embeddings=8192,
                                          rope_theta=100000.0, rms_norm_eps=1e-5, bos_token_id=0, eos_token_id=2,
                                          pad_token_id=1, initializer_range=init_std)
        model = transformers.LlamaForCausalLM(config)
    model_dir = os.path.join(out_dir, kind)
    model.eval().save_pretrained(model_dir)
    return model_dir


def word_level_tokenizer(model_dir: str, vocab_size: int, out_dir: str) -> None:
    """A tokenizer with one token "t<id>" per id: CTranslate2's converter needs one, and ids map to themselves."""
    from tokenizers import Tokenizer, models
    vocab = {f"t{i}": i for i in range(vocab_size)}
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="t3")),
        bos_token="t0", pad_token="t1", eos_token="t2", unk_token="t3")
    tokenizer.save_pretrained(out_dir)


def convert_ct2(model_dir: str, out_dir: str) -> str:
    """CTranslate2's own converter on a staging copy of the HF directory (links to the weights, a config that
    CT2 4.8.5 can read for transformers-5 BART, a word-level tokenizer where the model has none)."""
    import ctranslate2
    stage = os.path.join(out_dir, "stage")
    os.makedirs(stage, exist_ok=True)
    for name in os.listdir(model_dir):
        os.symlink(os.path.join(model_dir, name), os.path.join(stage, name))
    with open(os.path.join(model_dir, "config.json")) as f:
        config = json.load(f)
    if config["model_type"] == "bart":
        config.update(normalize_before=False, add_final_layer_norm=False)
        os.remove(os.path.join(stage, "config.json"))
        with open(os.path.join(stage, "config.json"), "w") as f:
            json.dump(config, f)
    if not os.path.exists(os.path.join(model_dir, "tokenizer.json")):
        word_level_tokenizer(model_dir, config["vocab_size"], stage)
    target = os.path.join(out_dir, "ct2")
    ctranslate2.converters.TransformersConverter(stage).convert(target, quantization=None, force=True)
    return target


# ---------------------------------------------------------------------------------------------- inputs
def random_prompts(num: int, length_range: Tuple[int, int], vocab_size: int, rng: random.Random) -> List[List[int]]:
    lo, hi = length_range
    return [[rng.randrange(FIRST_ID, vocab_size) for _ in range(rng.randint(lo, hi))] for _ in range(num)]


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
        model_dir = random_model("bart" if name == "bart" else "llama", args.seed, args.init_std,
                                 args.tie_lm_head, tmp)
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
