"""`seq2seq-engine transcribe AUDIO... --model whisper-tiny.en [--language de] [--task translate] [--timestamps]
[--output-format txt|json|srt|vtt] [--output-dir DIR]`.

With --output-dir, one file per input (`<input stem>.<format>`; a clashing stem gets `-<n>` added). Without it,
txt prints one line per input to stdout (an empty line for a failed input, so lines match inputs), json prints
one JSON object per line, and srt/vtt print the subtitles of a single input. Failures are reported on stderr;
the exit status is 1 when any input failed (the others are still written), 2 for a usage or model error.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, List, Optional, Sequence, TextIO

from seq2seq_engine.transcription.results import OUTPUT_FORMATS, TranscriptionResult, render

EXIT_OK, EXIT_FAILED_INPUTS, EXIT_USAGE = 0, 1, 2


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the `transcribe` subcommand to an argparse subparsers object; returns its parser."""
    parser = subparsers.add_parser("transcribe", help="transcribe audio files with a Whisper model",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    configure_parser(parser)
    return parser


def configure_parser(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("audio", nargs="+", metavar="AUDIO", help="audio files (wav, flac, ogg, mp3, ...)")
    parser.add_argument("--model", default="whisper-tiny.en",
                        help="HF model directory, CTranslate2 Whisper directory, or a packaged name "
                             "(whisper-tiny.en, whisper-base); default: whisper-tiny.en")
    parser.add_argument("--language", default=None,
                        help="spoken language (code or name, e.g. en, german); default: detect per file")
    parser.add_argument("--task", default="transcribe", choices=["transcribe", "translate"],
                        help="translate = into English (multilingual models)")
    parser.add_argument("--timestamps", action="store_true", help="predict timestamps: one segment per phrase")
    parser.add_argument("--condition-on-previous-text", action="store_true",
                        help="decode each file's 30 s windows in order, prompting with the previous text")
    parser.add_argument("--max-new-tokens", type=int, default=None, help="per 30 s window (default 224)")
    parser.add_argument("--beam-width", type=int, default=1, help="beam search with this many beams (1: greedy)")
    parser.add_argument("--output-format", default="txt", choices=list(OUTPUT_FORMATS))
    parser.add_argument("--output-dir", default=None, help="write one file per input here (created)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--quantization", default=None, choices=["int8"],
                        help="int8: Linear layers on int8 weights and dynamic int8 activations (CPU, float32)")
    parser.add_argument("--device", default="auto", help="auto, cpu or cuda")
    parser.add_argument("--kv-cache-space-gb", type=float, default=1.0)
    parser.add_argument("--swap-space-gb", type=float, default=0.1, help="CPU swap pool for preempted windows")
    parser.add_argument("--max-num-seqs", type=int, default=64, help="most windows decoded at once")
    parser.add_argument("--no-skip-silence", dest="skip_silence", action="store_false",
                        help="decode silent windows too (by default they give no text)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    return parser


def _output_paths(sources: Sequence[str], output_dir: str, output_format: str) -> List[str]:
    used, paths = set(), []
    for source in sources:
        stem = os.path.splitext(os.path.basename(os.path.normpath(source)))[0] or "audio"
        name, n = stem, 1
        while name in used:
            n += 1
            name = f"{stem}-{n}"
        used.add(name)
        paths.append(os.path.join(output_dir, f"{name}.{output_format}"))
    return paths


def write_results(results: Sequence[TranscriptionResult], sources: Sequence[str], output_format: str,
                  output_dir: Optional[str], out: TextIO, err: TextIO) -> int:
    """Write the results as the CLI does; returns the exit status (1 if any input failed)."""
    failed = 0
    for source, result in zip(sources, results):
        if result.error is not None:
            failed += 1
            message = result.error if result.error.startswith(f"{source}:") else f"{source}: {result.error}"
            err.write(f"seq2seq-engine transcribe: {message}\n")
    if output_dir is not None:
        os.makedirs(output_dir, exist_ok=True)
        for path, result in zip(_output_paths(sources, output_dir, output_format), results):
            if result.error is not None and output_format != "json":
                continue
            with open(path, "w", encoding="utf-8") as handle:
                handle.write(render(result, output_format))
    elif output_format == "txt":
        for result in results:
            out.write(result.text.replace("\n", " ") + "\n")
    elif output_format == "json":
        for source, result in zip(sources, results):
            record = result.to_dict()
            record["source"] = source
            out.write(json.dumps(record, ensure_ascii=False) + "\n")
    else:
        for result in results:
            if result.error is None:
                out.write(render(result, output_format))
    out.flush()
    return EXIT_FAILED_INPUTS if failed else EXIT_OK


def run(args: argparse.Namespace, out: Optional[TextIO] = None, err: Optional[TextIO] = None) -> int:
    """Run the `transcribe` command for parsed arguments; returns the exit status."""
    out = out or sys.stdout
    err = err or sys.stderr
    if args.output_dir is None and args.output_format in ("srt", "vtt") and len(args.audio) > 1:
        err.write(f"seq2seq-engine transcribe: error: --output-format {args.output_format} with several inputs "
                  f"needs --output-dir\n")
        return EXIT_USAGE
    try:
        from seq2seq_engine.entrypoints.llm import LLM
        from seq2seq_engine.model_loader.resolver import resolve_model_path
        from seq2seq_engine.transcription.pipeline import transcribe

        llm = LLM(resolve_model_path(args.model), dtype=args.dtype, quantization=args.quantization,
                  device=args.device, kv_cache_space_gb=args.kv_cache_space_gb, max_num_seqs=args.max_num_seqs,
                  swap_space_gb=args.swap_space_gb)
        results = transcribe(llm, list(args.audio), language=args.language, task=args.task,
                             timestamps=args.timestamps, condition_on_previous_text=args.condition_on_previous_text,
                             max_new_tokens=args.max_new_tokens, use_tqdm=not args.quiet,
                             skip_silence=args.skip_silence, beam_width=args.beam_width)
    except (ValueError, TypeError, FileNotFoundError, NotImplementedError) as error:
        err.write(f"seq2seq-engine transcribe: error: {error}\n")
        return EXIT_USAGE
    return write_results(results, list(args.audio), args.output_format, args.output_dir, out, err)


def main(argv: Optional[List[str]] = None) -> int:
    """`python -m seq2seq_engine.entrypoints.transcribe_cli AUDIO... [options]`."""
    parser = configure_parser(argparse.ArgumentParser(prog="seq2seq-engine transcribe", description=__doc__,
                                                      formatter_class=argparse.RawDescriptionHelpFormatter))
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
