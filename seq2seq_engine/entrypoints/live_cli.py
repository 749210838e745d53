"""`seq2seq-engine transcribe - --live [--sample-rate 16000] [--input-format auto]`: audio from stdin (raw s16le
mono, or any container FFmpeg decodes) transcribed as it arrives, each turn's text printed on its own line as soon as
it is final."""
from __future__ import annotations

import argparse
import queue
import sys
import threading
from typing import Any, BinaryIO, Dict, List, Optional, TextIO

from seq2seq_engine.engine_port import EnginePort
from seq2seq_engine.entrypoints.engine_flags import lora_request_from_args
from seq2seq_engine.entrypoints.live_input import END, INPUT_FORMATS, read_blocks
from seq2seq_engine.transcription.live import Completed, LiveDecoder, LiveOptions, LiveSession
from seq2seq_engine.transcription.live.pcm import Pcm16Stream

# Blocks read ahead of the transcription (each at most 100 ms of raw audio, or one decoded container frame): the
# reader thread waits when the queue is full, so memory does not grow with input that arrives faster than real time.
MAX_QUEUED_BLOCKS = 64


def add_live_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("live", "transcribe a live stream from stdin (AUDIO must be '-')")
    group.add_argument("--live", action="store_true",
                       help="read audio from stdin as it arrives (raw s16le mono, e.g. ffmpeg -i URL -f s16le -ar "
                            "16000 -ac 1 -, or a container: wav, ogg, webm, mp3, flac, ...), find turns with Silero "
                            "VAD and print each turn's text once it is final")
    group.add_argument("--sample-rate", type=int, default=None, metavar="HZ",
                       help="with --live: the rate of raw s16le input (default 16000; others are resampled); a "
                            "container names its own")
    group.add_argument("--input-format", choices=INPUT_FORMATS, default="auto",
                       help="with --live: auto (default) decodes a container recognised by its first bytes and reads "
                            "anything else as raw s16le; s16le or container forces one")


def check_live_arguments(args: argparse.Namespace) -> None:
    """ValueError for flags --live does not take with the AUDIO it was given."""
    if list(args.audio) != ["-"]:
        raise ValueError(f"--live reads stdin: give '-' as the only AUDIO, got {' '.join(args.audio)}")
    if args.sample_rate is not None:
        if args.input_format == "container":
            raise ValueError("--sample-rate is the rate of raw s16le input: a container (--input-format container) "
                             "names its own")
        Pcm16Stream(args.sample_rate)  # checks the rate
    if args.output_dir is not None or args.output_format != "txt":
        raise ValueError("--live prints text lines to stdout: --output-dir and --output-format are not taken")


class OutputClosed(Exception):
    """The reader of the printed lines went away (stdout is a closed pipe): the transcription stops."""


def run_live(args: argparse.Namespace, engine_kwargs: Dict[str, Any], out: TextIO,
             source: Optional[BinaryIO] = None) -> None:
    """Transcribe stdin (or `source`) live until its end, printing each turn's final text as one line. Input is
    read no faster than it is transcribed: while the session is backlogged no block is taken, the reader thread
    blocks on the full queue and stops reading, and the writer to stdin is held back by the pipe. ValueError when
    stdin is closed; OutputClosed when stdout is."""
    from seq2seq_engine.entrypoints.llm import LLM

    if source is None and sys.stdin is None:
        raise ValueError("stdin is closed: --live reads the audio from stdin ('-')")
    lora = lora_request_from_args(args)
    engine: EnginePort = LLM(args.model, **engine_kwargs).llm_engine
    if lora is not None:
        engine.add_lora(lora)  # read now: a bad adapter is a usage error
    options = LiveOptions(language=args.language, prompt=getattr(args, "initial_prompt", None))
    session = LiveSession(options, LiveDecoder.for_engine(engine, lora))  # every decode with --lora's adapter
    blocks: "queue.Queue[Any]" = queue.Queue(maxsize=MAX_QUEUED_BLOCKS)
    reader = threading.Thread(target=read_blocks, daemon=True,
                              args=(source or sys.stdin.buffer, args.input_format, args.sample_rate, blocks))
    reader.start()
    ended = False
    while not ended or engine.has_unfinished_requests():
        events: List[Any] = []
        if not ended and not session.backlogged:
            ended = _take_blocks(blocks, session, events, wait=not engine.has_unfinished_requests())
        run_requests(engine, session, events)
        _print_turns(events, out)


def _take_blocks(blocks: "queue.Queue[Any]", session: LiveSession, events: List[Any], wait: bool) -> bool:
    """Append the blocks read so far (waiting for one when `wait`) until the session is backlogged; True at the end
    of the input (the turn being spoken is then committed)."""
    while not session.backlogged:
        try:
            block = blocks.get(block=wait)
        except queue.Empty:
            return False
        wait = False
        if isinstance(block, Exception):
            raise block
        if block is END:
            events += _commit_rest(session)
            return True
        events += session.append(block)
    return False


def _commit_rest(session: LiveSession) -> List[Any]:
    """At the end of the input: the turn being spoken ends there (nothing when too little audio is held)."""
    try:
        return session.commit()
    except ValueError:
        return []


def run_requests(engine: EnginePort, session: LiveSession, events: List[Any]) -> None:
    """The in-process owner's turn: submit the queued decodes (each with its decoder's LoRA adapter), run one engine
    step, hand back the finished ones (their events into `events`) and submit what they queued."""
    _submit(engine, session)
    stale = session.take_stale()
    if stale:
        engine.abort_request(stale)
    if engine.has_unfinished_requests():
        for output in engine.step(finished_only=True):
            events += session.on_output(output.request_id, output.outputs[0].token_ids)
    _submit(engine, session)


def _submit(engine: EnginePort, session: LiveSession) -> None:
    for request in session.take_requests():
        adapter = {} if request.lora_request is None else {"lora_request": request.lora_request}
        engine.add_request(request.request_id, request.prompt, request.params, **adapter)


def _print_turns(events: List[Any], out: TextIO) -> None:
    try:
        for event in events:
            if isinstance(event, Completed) and event.transcript:
                out.write(event.transcript + "\n")
                out.flush()
    except BrokenPipeError:
        raise OutputClosed() from None
