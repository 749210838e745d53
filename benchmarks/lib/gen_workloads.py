"""The generation workloads of throughput.py (and linear_kernels.py --mode floor): options, prompts, jobs."""
from __future__ import annotations

import argparse
import random
from typing import List, Optional, Tuple

import transformers

from benchmarks.lib.common import add_timing_args
from benchmarks.lib.gen_engines import GenJob
from benchmarks.lib.text_models import random_model
from seq2seq_engine.model_loader.resolver import resolve_model_path

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


def parse_args(argv=None, description: Optional[str] = None) -> argparse.Namespace:
    """throughput.py's options (`description`: its help text); linear_kernels.py --mode floor reads them too."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
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
