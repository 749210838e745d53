"""Command line: `seq2seq-engine generate|summarize|translate ...` (text/token prompts, see text_cli),
`seq2seq-engine transcribe AUDIO...` (Whisper, see transcribe_cli), `seq2seq-engine serve MODEL` (the
OpenAI-compatible server, see openai/serve_cli) and `seq2seq-engine env` (machine and kernel report, see env_cli).
An unrecognized flag is refused naming the command's closest flag."""
from __future__ import annotations

import argparse
import atexit
import gc
import sys
from typing import Any, List, Optional, Sequence

from seq2seq_engine.entrypoints import env_cli, text_cli, transcribe_cli
from seq2seq_engine.entrypoints.openai import serve_cli
from seq2seq_engine.transcription.option_aliases import closest, unsupported_note


class _Parser(argparse.ArgumentParser):
    """argparse's parser; unrecognized arguments are refused by the command's parser (its usage shown), naming the
    command's closest flag to each unknown one, or for `transcribe` the faster-whisper / openai-whisper option it is
    that has no counterpart here."""

    commands: Any = None   # the subparsers action, set by build_parser

    def parse_args(self, args: Optional[Sequence[str]] = None, namespace: Any = None) -> argparse.Namespace:
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            name = getattr(parsed, "command", None)
            command = self.commands.choices.get(name) if self.commands is not None else None
            (command or self).error(unrecognized_message(extras, command or self, name))
        return parsed


def unrecognized_message(extras: List[str], parser: argparse.ArgumentParser, command: Optional[str]) -> str:
    """argparse's "unrecognized arguments: ..." with, for each unknown --flag, the closest of `parser`'s flags."""
    flags = [flag for flag in parser._option_string_actions if flag.startswith("--")]  # argparse's own flag table
    unknown = [extra.split("=", 1)[0] for extra in extras if extra.startswith("--")]
    notes = []
    for flag in unknown:
        note = unsupported_note(flag[2:].replace("-", "_"), flag) if command == "transcribe" else None
        match = closest(flag, flags)
        if note is not None:
            notes.append(note)
        elif match is not None:
            notes.append(f"did you mean {match}?" if len(unknown) == 1 else f"{flag}: did you mean {match}?")
    return "; ".join([f"unrecognized arguments: {' '.join(extras)}"] + notes)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="seq2seq-engine", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    parser.commands = commands
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
