"""Command line: `seq2seq-engine generate ...` (text/token prompts) and `seq2seq-engine transcribe AUDIO...`."""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Iterator, List, Optional, TextIO

from seq2seq_engine.entrypoints import transcribe_cli
from seq2seq_engine.outputs import RequestOutput
from seq2seq_engine.sampling_params import SamplingParams


def read_prompts(path: str) -> Iterator[Any]:
    """A .txt file gives one text prompt per non-empty line; a .jsonl file one prompt object per line."""
    with open(path, encoding="utf-8") as handle:
        for line_number, line in enumerate(handle, start=1):
            line = line.rstrip("\n")
            if not line.strip():
                continue
            if not path.endswith(".jsonl"):
                yield line
                continue
            try:
                yield json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"{path}:{line_number}: not valid JSON ({error.msg})") from None


def _output_record(output: RequestOutput) -> dict:
    completion = output.outputs[0]
    return {"prompt": output.encoder_prompt if output.encoder_prompt is not None else output.prompt,
            "text": completion.text, "token_ids": completion.token_ids,
            "finish_reason": completion.finish_reason, "cumulative_logprob": completion.cumulative_logprob}


def _batches(items: Iterator[Any], size: int) -> Iterator[List[Any]]:
    batch: List[Any] = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def run_generate(args: argparse.Namespace, out: TextIO) -> int:
    from seq2seq_engine.entrypoints.llm import LLM
    params = SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                            max_tokens=args.max_tokens, seed=args.seed)
    llm = LLM(args.model, dtype=args.dtype, skip_tokenizer_init=args.skip_tokenizer_init,
              kv_cache_space_gb=args.kv_cache_space_gb)
    count = 0
    for batch in _batches(read_prompts(args.input), args.batch_size):
        for output in llm.generate(batch, params, use_tqdm=not args.quiet):
            out.write(json.dumps(_output_record(output), ensure_ascii=False) + "\n")
            count += 1
        out.flush()
    return count


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="seq2seq-engine", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    generate = commands.add_parser("generate", help="generate for each prompt of a .txt or .jsonl file")
    generate.add_argument("--model", required=True, help="model directory (config.json + weights)")
    generate.add_argument("--input", required=True, help=".txt (one prompt a line) or .jsonl (prompt objects)")
    generate.add_argument("--output", default="-", help="output .jsonl file ('-' for stdout)")
    generate.add_argument("--max-tokens", type=int, default=64)
    generate.add_argument("--temperature", type=float, default=0.0)
    generate.add_argument("--top-p", type=float, default=1.0)
    generate.add_argument("--top-k", type=int, default=-1)
    generate.add_argument("--seed", type=int, default=None)
    generate.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    generate.add_argument("--kv-cache-space-gb", type=float, default=4.0)
    generate.add_argument("--batch-size", type=int, default=256, help="prompts per engine run (output order kept)")
    generate.add_argument("--skip-tokenizer-init", action="store_true", help="token-id prompts only, no text")
    generate.add_argument("--quiet", action="store_true", help="no progress bar")
    transcribe_cli.add_parser(commands)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "transcribe":
        return transcribe_cli.run(args)
    try:
        if args.output == "-":
            count = run_generate(args, sys.stdout)
        else:
            with open(args.output, "w", encoding="utf-8") as out:
                count = run_generate(args, out)
    except (ValueError, TypeError, FileNotFoundError) as error:
        print(f"seq2seq-engine: error: {error}", file=sys.stderr)
        return 2
    print(f"seq2seq-engine: wrote {count} results", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
