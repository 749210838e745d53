"""Command line: `seq2seq-engine generate|summarize|translate ...` (text/token prompts, see text_cli),
`seq2seq-engine transcribe AUDIO...` (Whisper, see transcribe_cli), `seq2seq-engine serve MODEL` (the
OpenAI-compatible server, see openai/serve_cli) and `seq2seq-engine env` (machine and kernel report, see env_cli)."""
from __future__ import annotations

import argparse
import atexit
import gc
import sys
from typing import List, Optional

from seq2seq_engine.entrypoints import env_cli, text_cli, transcribe_cli
from seq2seq_engine.entrypoints.openai import serve_cli


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="seq2seq-engine", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    text_cli.add_parsers(commands)
    transcribe_cli.add_parser(commands)
    serve_cli.add_parser(commands)
    env_cli.add_parser(commands)
    return parser


def _skip_collection_at_exit() -> None:
    """Freeze the heap once the interpreter starts shutting down: its final collections then skip the millions of
    objects torch, transformers and the model left (0.5 s of a whisper-base run's 0.6 s exit). Objects in reference
    cycles are then not finalized, which CPython does not promise at exit anyway; files are closed by their
    owners before the command returns."""
    gc.freeze()


def main(argv: Optional[List[str]] = None) -> int:
    atexit.unregister(_skip_collection_at_exit)   # once, however often main runs in one process
    atexit.register(_skip_collection_at_exit)
    args = build_parser().parse_args(argv)
    if args.command == "transcribe":
        return transcribe_cli.run(args)
    if args.command == "serve":
        return serve_cli.run(args)
    if args.command == "env":
        return env_cli.run(args)
    return text_cli.main(args)


if __name__ == "__main__":
    sys.exit(main())
