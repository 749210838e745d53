"""`seq2seq-engine generate|summarize|translate --model DIR --input FILE.jsonl|txt [--output OUT.jsonl]`.

Each input line becomes one request; results are written as JSON lines in input order, each as soon as it and
all before it are done (so a long file streams), with a progress bar on stderr. Generation settings come from the
model's generation_config.json (e.g. bart-large-cnn's 4 beams, length penalty, min/max lengths, no_repeat_ngram)
and any flag given here overrides them. A line the engine refuses gets {"index": i, "error": "..."} at its place
and the exit status is 1; a usage or model error exits with 2 (a --lora adapter that cannot be served too). With
--lora PATH every prompt runs with that PEFT LoRA adapter. With --ray [ADDRESS] the prompts run on a Ray cluster, one
engine per replica (ray_cli.py), and the output file is the same.

Input: .txt = one text prompt per non-empty line; .jsonl = one JSON value per line: a string, or a prompt object
({"prompt": ...}, {"prompt_token_ids": [...]}, {"encoder_prompt": ..., "decoder_prompt": ...}).
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Dict, Iterator, List, Optional, TextIO, Tuple

from tqdm.auto import tqdm

from seq2seq_engine.engine.streaming import StreamError, stream_in_order
from seq2seq_engine.entrypoints.engine_flags import (add_lora_arguments, add_precision_arguments, lora_kwargs,
                                                     lora_request_from_args, switch_kwargs)
from seq2seq_engine.entrypoints.ray_cli import (DEFAULT_BATCH_SIZE, add_ray_arguments, check_ray_arguments,
                                                generate_records_on_ray)
from seq2seq_engine.entrypoints.task_prefix import add_prefix_argument, with_prefix
from seq2seq_engine.integrations.adapters import AdapterEngine
from seq2seq_engine.integrations.ray_jobs import RayJobError, RayMissingError
from seq2seq_engine.lora_request import LoRARequest
from seq2seq_engine.output_records import output_record, result_fields
from seq2seq_engine.outputs import RequestOutput
from seq2seq_engine.tokenization.languages import translation_languages

EXIT_OK, EXIT_FAILED_INPUTS, EXIT_USAGE = 0, 1, 2
COMMANDS = {
    "generate": "generate for each prompt (decoder-only or encoder/decoder models)",
    "summarize": "summarize each document with an encoder/decoder model (e.g. BART)",
    "translate": "translate each line with an encoder/decoder model (mBART, M2M100/NLLB, Marian: --tgt-lang)",
}


def read_prompts(path: str) -> List[Any]:
    """A .txt file gives one text prompt per non-empty line; a .jsonl file one prompt value per line."""
    prompts = []
    with open(path, encoding="utf-8") as handle:
        for line_number, line in enumerate(handle, start=1):
            line = line.rstrip("\n")
            if not line.strip():
                continue
            if not path.endswith(".jsonl"):
                prompts.append(line)
                continue
            try:
                prompts.append(json.loads(line))
            except json.JSONDecodeError as error:
                raise ValueError(f"{path}:{line_number}: not valid JSON ({error.msg})") from None
    return prompts


def add_parsers(subparsers: Any) -> None:
    for name, help_text in COMMANDS.items():
        parser = subparsers.add_parser(name, help=help_text, description=__doc__,
                                       formatter_class=argparse.RawDescriptionHelpFormatter)
        _configure(parser, translate=name == "translate")


def _configure(parser: argparse.ArgumentParser, translate: bool) -> None:
    parser.add_argument("--model", required=True, help="model directory (config.json + weights) or packaged name")
    parser.add_argument("--input", required=True, help=".txt (one prompt a line) or .jsonl (one prompt a line)")
    parser.add_argument("--output", default="-", help="output .jsonl file ('-': stdout)")
    group = parser.add_argument_group("generation (default: the model's generation_config.json)")
    group.add_argument("--max-tokens", type=int, default=None, help="new tokens at most")
    group.add_argument("--min-tokens", type=int, default=None, help="new tokens at least (EOS banned before)")
    group.add_argument("--beam-width", type=int, default=None, help="beam search with this many beams (1: none)")
    group.add_argument("--length-penalty", type=float, default=None, help="beam search: score / len ** this")
    group.add_argument("--no-repeat-ngram-size", type=int, default=None)
    group.add_argument("--repetition-penalty", type=float, default=None)
    group.add_argument("--temperature", type=float, default=None, help="0: greedy; > 0: sampling")
    group.add_argument("--top-p", type=float, default=None)
    group.add_argument("--top-k", type=int, default=None)
    group.add_argument("--seed", type=int, default=None, help="per-request sampling seed")
    add_prefix_argument(group)
    if translate:
        group.add_argument("--src-lang", default=None,
                           help="source language code of the tokenizer (mBART en_XX, M2M100 en, NLLB eng_Latn)")
        group.add_argument("--tgt-lang", default=None, help="target language code: starts the decoder (mBART, "
                           "M2M100, NLLB) or, for Marian, the >>xx<< token put before the source")
    engine = parser.add_argument_group("engine")
    add_precision_arguments(engine)
    engine.add_argument("--kv-cache-space-gb", type=float, default=4.0)
    engine.add_argument("--max-num-seqs", type=int, default=256)
    engine.add_argument("--max-in-flight", type=int, default=512, help="requests queued in the engine at once")
    engine.add_argument("--skip-tokenizer-init", action="store_true", help="token-id prompts only, no text")
    engine.add_argument("--quiet", action="store_true", help="no progress bar")
    add_lora_arguments(engine)
    add_ray_arguments(parser, DEFAULT_BATCH_SIZE["text"])


def overrides_from_args(args: argparse.Namespace) -> Dict[str, Any]:
    """The generation flags given on the command line (None = keep the model's default)."""
    names = ("max_tokens", "min_tokens", "beam_width", "length_penalty", "no_repeat_ngram_size",
             "repetition_penalty", "temperature", "top_p", "top_k", "seed")
    return {name: getattr(args, name) for name in names if getattr(args, name) is not None}


def translation_prompts(prompts: List[Any], tokenizer: Any, args: argparse.Namespace,
                        model_type: Optional[str] = None) -> Iterator[Any]:
    """The prompts with --src-lang/--tgt-lang applied as the model family expects (tokenization/languages.py)."""
    languages = translation_languages(tokenizer, getattr(args, "src_lang", None), getattr(args, "tgt_lang", None),
                                      model_type)
    yield from languages.prompts(prompts)


def _record(index: int, item: Any) -> dict:
    if isinstance(item, StreamError):
        return output_record(index, None, item.error)
    assert isinstance(item, RequestOutput)
    return output_record(index, result_fields(item), None)


def engine_kwargs(args: argparse.Namespace) -> Dict[str, Any]:
    """The LLM keyword arguments the flags give (the model aside)."""
    return dict(dtype=args.dtype, quantization=args.quantization, device=args.device,
                kv_cache_dtype=args.kv_cache_dtype, enforce_eager=args.enforce_eager,
                skip_tokenizer_init=args.skip_tokenizer_init, kv_cache_space_gb=args.kv_cache_space_gb,
                max_num_seqs=args.max_num_seqs, **switch_kwargs(args), **lora_kwargs(args))


def _local_records(args: argparse.Namespace, prompts: List[Any], lora: Optional[LoRARequest]) -> Iterator[dict]:
    from seq2seq_engine.entrypoints.llm import LLM
    llm = LLM(args.model, **engine_kwargs(args))
    if lora is not None:
        llm.llm_engine.add_lora(lora)  # read now: a bad adapter is a usage error before any prompt runs
    engine = AdapterEngine(llm.llm_engine, lora)  # every request with the adapter (none: the base model)
    overrides = overrides_from_args(args)
    model_type = getattr(llm.llm_engine.hf_config, "model_type", None)
    requests = ((prompt, dict(overrides))
                for prompt in translation_prompts(prompts, llm.get_tokenizer(), args, model_type))
    with tqdm(total=len(prompts), desc=f"{args.command}", unit="req", disable=args.quiet) as progress:
        for index, item in stream_in_order(engine, requests, args.max_in_flight,
                                           on_finished=lambda: progress.update(1)):
            yield _record(index, item)


def run(args: argparse.Namespace, out: TextIO) -> Tuple[int, int]:
    """Write one JSON line per input (here, or with --ray on the cluster); returns (results written, refused)."""
    check_ray_arguments(args)
    lora = lora_request_from_args(args)
    prompts = with_prefix(read_prompts(args.input), args)
    if args.ray is not None:
        records = generate_records_on_ray(args, prompts, engine_kwargs(args), overrides_from_args(args))
    else:
        records = _local_records(args, prompts, lora)
    written = failed = 0
    for record in records:
        out.write(json.dumps(record, ensure_ascii=False) + "\n")
        out.flush()
        written += 1
        failed += "error" in record
    return written, failed


def main(args: argparse.Namespace) -> int:
    try:
        if args.output == "-":
            written, failed = run(args, sys.stdout)
        else:
            with open(args.output, "w", encoding="utf-8") as out:
                written, failed = run(args, out)
    except (ValueError, TypeError, FileNotFoundError, RayMissingError, RayJobError) as error:
        print(f"seq2seq-engine: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    print(f"seq2seq-engine: wrote {written} results ({failed} refused)", file=sys.stderr)
    return EXIT_FAILED_INPUTS if failed else EXIT_OK
