"""`seq2seq-engine transcribe AUDIO|DIR... --model whisper-tiny.en [--recursive] [--language de] [--task translate]
[--[no-]timestamps] [--temperature 0,0.2,0.4] [--initial-prompt TEXT] [--clip-timestamps 0,30] [--vad-filter
[--vad-threshold 0.5 ...]] [--[no-]word-timestamps] [--output-format txt|json|srt|vtt [--max-line-width N]
[--max-line-count N] [--max-words-per-line N] [--highlight-words]] [--output-dir OUT [--overwrite]]
[--ray [ADDRESS] --num-replicas N --cpus-per-replica C]`; `seq2seq-engine transcribe - --live [--sample-rate 16000]`.

AUDIO is any file FFmpeg decodes (wav, flac, mp3, m4a/aac, ogg/opus, webm, mp4/mkv video's audio, ...); a DIR
contributes its audio files by extension (AUDIO_EXTENSIONS in audio_files.py; subfolders too with --recursive).
With --output-dir, one file per input, written as soon as that input finishes (temporary file + rename): a file
given by name writes `OUT/<stem>.<format>`, a folder's files mirror their path under it (`DIR/a/x.mp3` ->
`OUT/a/x.<format>`); a clashing name gets `-<n>` added. Inputs whose output exists already are skipped (a resumed
run), unless --overwrite. Without --output-dir, txt prints one line per input to stdout (an empty line for a
failed input, so lines match inputs), json prints one JSON object per line, and srt/vtt print the subtitles of a
single input. srt/vtt cues last at most 7 s, never run across a pause over 1 s and hold at most 2 lines of 42
characters (the --max-line-* flags); for them --word-timestamps is on unless --[no-]timestamps or
--[no-]word-timestamps is given (--timestamps alone is faster, its cues less well placed). Failures are reported
on stderr at the end; the exit status is 1 when any input failed (the others are still written), 2 for a usage or
model error (a --lora adapter that cannot be served too). With --lora PATH every window runs with that PEFT LoRA
adapter. With --ray the files are transcribed on a Ray cluster, one engine per replica (ray_cli.py); the outputs are
the same. With --live, raw s16le mono audio is read from stdin as it arrives and each turn's text is printed on its
own line once final (live_cli.py).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from typing import Any, Dict, Iterator, List, Optional, Sequence, TextIO, Tuple, Union

from seq2seq_engine.entrypoints.audio_files import AudioJob, expand_inputs, output_path
from seq2seq_engine.entrypoints.engine_flags import (add_lora_arguments, add_precision_arguments, lora_kwargs,
                                                     lora_request_from_args, switch_kwargs)
from seq2seq_engine.entrypoints.live_cli import OutputClosed, add_live_arguments, check_live_arguments, run_live
from seq2seq_engine.entrypoints.ray_cli import DEFAULT_BATCH_SIZE, add_ray_arguments, check_ray_arguments
from seq2seq_engine.entrypoints.transcribe_flags import (add_decoding_arguments, add_subtitle_arguments,
                                                         add_vad_arguments, add_word_arguments, options_from_args,
                                                         subtitle_options)
from seq2seq_engine.entrypoints.transcribe_outputs import OutputWriter, pending_jobs, report_failures
from seq2seq_engine.integrations.ray_jobs import RayJobError, RayMissingError
from seq2seq_engine.transcription.options import TranscriptionOptions
from seq2seq_engine.transcription.output.results import OUTPUT_FORMATS, TranscriptionResult, render
from seq2seq_engine.transcription.output.subtitles import SubtitleOptions

EXIT_OK, EXIT_FAILED_INPUTS, EXIT_USAGE = 0, 1, 2
EXIT_OUTPUT_CLOSED = 141  # 128 + SIGPIPE: what a shell reports for a writer whose reader went away


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the `transcribe` subcommand to an argparse subparsers object; returns its parser."""
    parser = subparsers.add_parser("transcribe", help="transcribe audio files with a Whisper model",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    configure_parser(parser)
    return parser


def configure_parser(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("audio", nargs="+", metavar="AUDIO",
                        help="audio or video files (wav, flac, mp3, m4a, ogg, opus, webm, mp4, mkv, ...) or folders "
                             "of them")
    parser.add_argument("--recursive", action="store_true", help="take the audio files in subfolders of a folder too")
    parser.add_argument("--model", default="whisper-tiny.en",
                        help="HF model directory, CTranslate2 Whisper directory, or a packaged name "
                             "(whisper-tiny.en, whisper-base); default: whisper-tiny.en")
    parser.add_argument("--language", default=None,
                        help="spoken language (code or name, e.g. en, german); default: detect per file")
    parser.add_argument("--task", default="transcribe", choices=["transcribe", "translate"],
                        help="translate = into English (multilingual models)")
    parser.add_argument("--timestamps", action=argparse.BooleanOptionalAction, default=None,
                        help="predict timestamps: one segment per phrase")
    parser.add_argument("--condition-on-previous-text", action="store_true",
                        help="decode each file's 30 s windows in order, prompting with the previous text")
    parser.add_argument("--max-new-tokens", type=int, default=None, help="per 30 s window (default 224)")
    parser.add_argument("--beam-width", type=int, default=None,
                        help="beam search with this many beams (default 5, faster-whisper's; 1: greedy)")
    parser.add_argument("--output-format", default="txt", choices=list(OUTPUT_FORMATS))
    parser.add_argument("--output-dir", default=None,
                        help="write one file per input here (created), each as soon as it is transcribed; inputs "
                             "whose file exists are skipped")
    parser.add_argument("--overwrite", action="store_true", help="with --output-dir: redo inputs whose file exists")
    add_precision_arguments(parser)
    parser.add_argument("--kv-cache-space-gb", type=float, default=1.0)
    parser.add_argument("--swap-space-gb", type=float, default=0.1, help="CPU swap pool for preempted windows")
    parser.add_argument("--max-num-seqs", type=int, default=64, help="most windows decoded at once")
    parser.add_argument("--no-skip-silence", dest="skip_silence", action="store_false",
                        help="decode silent windows too (by default they give no text)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    add_lora_arguments(parser)
    add_decoding_arguments(parser)
    add_vad_arguments(parser)
    add_word_arguments(parser)
    add_subtitle_arguments(parser)
    add_ray_arguments(parser, DEFAULT_BATCH_SIZE["transcribe"])
    add_live_arguments(parser)
    return parser


def write_results(results: Sequence[TranscriptionResult], sources: Sequence[str], output_format: str,
                  output_dir: Optional[str], out: TextIO, err: TextIO,
                  subtitles: Union[SubtitleOptions, int, None] = None) -> int:
    """Write the results as the CLI does; returns the exit status (1 if any input failed). subtitles: how srt/vtt
    cues are cut (an int: max_words_per_line)."""
    failed = 0
    for source, result in zip(sources, results):
        if result.error is not None:
            failed += 1
            message = result.error if result.error.startswith(f"{source}:") else f"{source}: {result.error}"
            err.write(f"seq2seq-engine transcribe: {message}\n")
    if output_dir is not None:
        os.makedirs(output_dir, exist_ok=True)
        paths = [output_path(output_dir, job, output_format) for job in expand_inputs(sources)]
        for path, result in zip(paths, results):
            if result.error is not None and output_format != "json":
                continue
            with open(path, "w", encoding="utf-8") as handle:
                handle.write(render(result, output_format, subtitles))
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
                out.write(render(result, output_format, subtitles))
    out.flush()
    return EXIT_FAILED_INPUTS if failed else EXIT_OK


def run(args: argparse.Namespace, out: Optional[TextIO] = None, err: Optional[TextIO] = None) -> int:
    """Run the `transcribe` command for parsed arguments; returns the exit status."""
    out = out or sys.stdout
    err = err or sys.stderr
    if args.live:
        return _run_live(args, out, err)
    try:
        options = options_from_args(args)  # checked before any file is looked at or the model loaded
        options = dataclasses.replace(options, lora_request=lora_request_from_args(args))
        subtitles = subtitle_options(args)
        check_ray_arguments(args)
    except (ValueError, TypeError, RayMissingError) as error:
        return _usage_error(err, str(error))
    jobs = expand_inputs(args.audio, args.recursive)
    if not jobs:
        return _usage_error(err, f"no audio files in {', '.join(args.audio)} (extensions: see --help"
                                 f"{'' if args.recursive else '; --recursive takes subfolders too'})")
    if args.output_dir is None and args.output_format in ("srt", "vtt") and len(jobs) > 1:
        return _usage_error(err, f"--output-format {args.output_format} with several inputs needs --output-dir")
    if args.output_dir is not None:
        jobs, skipped = pending_jobs(jobs, args.output_dir, args.output_format, args.overwrite)
        if skipped:
            err.write(f"seq2seq-engine transcribe: skipped {skipped} input(s) whose output exists in "
                      f"{args.output_dir} (--overwrite redoes them)\n")
        if not jobs:
            return EXIT_OK
    try:
        results = _results(args, options, jobs)
        if args.output_dir is None:
            ordered = _in_input_order(results, len(jobs))
            return write_results(ordered, [job.source for job in jobs], args.output_format, None, out, err,
                                 subtitles)
        writer = OutputWriter(jobs, args.output_dir, args.output_format, subtitles)
        for index, result in results:
            writer(index, result)
    except (ValueError, TypeError, FileNotFoundError, NotImplementedError, RayJobError) as error:
        return _usage_error(err, str(error))
    report_failures(writer.failures, len(jobs), err)
    return EXIT_FAILED_INPUTS if writer.failures else EXIT_OK


def _run_live(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    try:
        check_live_arguments(args)
        run_live(args, engine_kwargs(args), out)
    except (ValueError, TypeError, FileNotFoundError) as error:
        return _usage_error(err, str(error))
    except OutputClosed:
        if out is sys.stdout:
            _silence_stdout()
        return EXIT_OUTPUT_CLOSED
    return EXIT_OK


def _silence_stdout() -> None:
    """Point a closed stdout at /dev/null, so the interpreter's flush at exit does not raise again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def _usage_error(err: TextIO, message: str) -> int:
    err.write(f"seq2seq-engine transcribe: error: {message}\n")
    return EXIT_USAGE


def engine_kwargs(args: argparse.Namespace) -> Dict[str, Any]:
    """The LLM keyword arguments the flags give (the model aside)."""
    return dict(dtype=args.dtype, quantization=args.quantization, device=args.device,
                kv_cache_dtype=args.kv_cache_dtype, kv_cache_space_gb=args.kv_cache_space_gb,
                max_num_seqs=args.max_num_seqs, swap_space_gb=args.swap_space_gb, enforce_eager=args.enforce_eager,
                **switch_kwargs(args), **lora_kwargs(args))


def _results(args: argparse.Namespace, options: TranscriptionOptions,
             jobs: Sequence[AudioJob]) -> Iterator[Tuple[int, TranscriptionResult]]:
    """(input index, result) for each job as soon as it finishes: here, or with --ray on the cluster."""
    if args.ray is not None:
        from seq2seq_engine.entrypoints.ray_cli import transcribe_on_ray
        without_lora = dataclasses.replace(options, lora_request=None)  # each replica reads --lora (ReplicaConfig)
        return transcribe_on_ray(args, without_lora, jobs, engine_kwargs(args))
    from seq2seq_engine.entrypoints.llm import LLM
    from seq2seq_engine.transcription.pipeline import iter_transcribe

    llm = LLM(args.model, **engine_kwargs(args))  # the engine resolves a short name, CT2 directory or GGUF file
    if options.lora_request is not None:
        llm.llm_engine.add_lora(options.lora_request)  # read now: a bad adapter is a usage error
    return iter_transcribe(llm, [job.source for job in jobs], options)


def _in_input_order(results: Iterator[Tuple[int, TranscriptionResult]], count: int) -> List[TranscriptionResult]:
    ordered: List[Optional[TranscriptionResult]] = [None] * count
    for index, result in results:
        ordered[index] = result
    return [result for result in ordered if result is not None]


def main(argv: Optional[List[str]] = None) -> int:
    """`python -m seq2seq_engine.entrypoints.transcribe_cli AUDIO... [options]`."""
    parser = configure_parser(argparse.ArgumentParser(prog="seq2seq-engine transcribe", description=__doc__,
                                                      formatter_class=argparse.RawDescriptionHelpFormatter))
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
