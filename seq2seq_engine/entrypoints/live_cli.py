"""`seq2seq-engine transcribe - --live [--sample-rate 16000]`: raw s16le mono audio from stdin transcribed as it
arrives, each turn's text printed on its own line as soon as it is final."""
from __future__ import annotations

import argparse
import queue
import sys
import threading
from typing import Any, BinaryIO, Dict, List, Optional, TextIO

from seq2seq_engine.transcription.live import Completed, LiveDecoder, LiveOptions, LiveSession
from seq2seq_engine.transcription.live.pcm import Pcm16Stream

READ_BYTES = 3200  # at most 100 ms of 16 kHz audio per read
_EOF = b""


def add_live_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("live", "transcribe a live stream from stdin (AUDIO must be '-')")
    group.add_argument("--live", action="store_true",
                       help="read raw s16le mono audio from stdin as it arrives (e.g. ffmpeg -i URL -f s16le -ar "
                            "16000 -ac 1 -), find turns with Silero VAD and print each turn's text once it is final")
    group.add_argument("--sample-rate", type=int, default=16000, metavar="HZ",
                       help="with --live: the rate of the raw s16le input (default 16000; others are resampled)")


def check_live_arguments(args: argparse.Namespace) -> None:
    """ValueError for flags --live does not take with the AUDIO it was given."""
    if list(args.audio) != ["-"]:
        raise ValueError(f"--live reads stdin: give '-' as the only AUDIO, got {' '.join(args.audio)}")
    Pcm16Stream(args.sample_rate)  # checks the rate
    if args.output_dir is not None or args.output_format != "txt":
        raise ValueError("--live prints text lines to stdout: --output-dir and --output-format are not taken")


def run_live(args: argparse.Namespace, engine_kwargs: Dict[str, Any], out: TextIO,
             source: Optional[BinaryIO] = None) -> None:
    """Transcribe stdin (or `source`) live until its end, printing each turn's final text as one line."""
    from seq2seq_engine.entrypoints.llm import LLM
    from seq2seq_engine.model_loader.resolver import resolve_model_path

    engine = LLM(resolve_model_path(args.model), **engine_kwargs).llm_engine
    options = LiveOptions(language=args.language, prompt=getattr(args, "initial_prompt", None))
    session = LiveSession(options, LiveDecoder.for_engine(engine))
    chunks: "queue.Queue[bytes]" = queue.Queue()
    reader = threading.Thread(target=_read, args=(source or sys.stdin.buffer, chunks), daemon=True)
    reader.start()
    pcm, odd, ended = Pcm16Stream(args.sample_rate), b"", False
    while not ended or engine.has_unfinished_requests():
        events: List[Any] = []
        wait = not engine.has_unfinished_requests()
        while not ended:  # all audio read so far; wait for some only while the engine is idle
            try:
                data = chunks.get(block=wait)
            except queue.Empty:
                break
            wait = False
            if data == _EOF:
                ended = True
                events += session.append(pcm.finish())
                events += _commit_rest(session)
            else:
                data, odd = _whole_samples(odd + data)
                events += session.append(pcm.decode(data))
        run_requests(engine, session, events)
        _print_turns(events, out)


def _read(source: BinaryIO, chunks: "queue.Queue[bytes]") -> None:
    read = getattr(source, "read1", source.read)
    while True:
        data = read(READ_BYTES)
        chunks.put(bytes(data) if data else _EOF)
        if not data:
            return


def _whole_samples(data: bytes):
    """The bytes of whole 2-byte samples, and the odd byte left for the next read."""
    cut = len(data) - len(data) % 2
    return data[:cut], data[cut:]


def _commit_rest(session: LiveSession) -> List[Any]:
    """At the end of the input: the turn being spoken ends there (nothing when too little audio is held)."""
    try:
        return session.commit()
    except ValueError:
        return []


def run_requests(engine: Any, session: LiveSession, events: List[Any]) -> None:
    """The in-process owner's turn: submit the queued decodes, run one engine step, hand back the finished ones
    (their events into `events`) and submit what they queued."""
    for request in session.take_requests():
        engine.add_request(request.request_id, request.prompt, request.params)
    stale = session.take_stale()
    if stale:
        engine.abort_request(stale)
    if engine.has_unfinished_requests():
        for output in engine.step(finished_only=True):
            events += session.on_output(output.request_id, output.outputs[0].token_ids)
    for request in session.take_requests():
        engine.add_request(request.request_id, request.prompt, request.params)


def _print_turns(events: List[Any], out: TextIO) -> None:
    for event in events:
        if isinstance(event, Completed) and event.transcript:
            out.write(event.transcript + "\n")
            out.flush()
