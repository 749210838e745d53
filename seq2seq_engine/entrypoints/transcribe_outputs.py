"""Output files of `seq2seq-engine transcribe --output-dir`: written atomically as each input finishes, resumable."""
from __future__ import annotations

import json
import os
import tempfile
from typing import List, Sequence, TextIO, Tuple, Union

from seq2seq_engine.entrypoints.audio_files import AudioJob, output_path
from seq2seq_engine.transcription.output.results import TranscriptionResult, render
from seq2seq_engine.transcription.output.subtitles import SubtitleOptions


def write_atomic(path: str, text: str) -> None:
    """Write `text` to `path` through a temporary file in the same folder and a rename, so `path` is either absent or
    complete, whenever the process stops (a resumed run never takes a half-written file for a finished one)."""
    folder = os.path.dirname(path) or "."
    os.makedirs(folder, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
    os.fchmod(handle, 0o666 & ~_umask())    # mkstemp makes 0600; an output file follows the umask, as open() does
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as stream:
            stream.write(text)
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise


def _umask() -> int:
    """The process's umask (read by setting it and putting it back at once)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def is_done(path: str, output_format: str) -> bool:
    """Whether a previous run finished this output: the file exists, and for json it records no error (a failed
    input's json error record is retried)."""
    if not os.path.isfile(path):
        return False
    if output_format != "json":
        return True
    try:
        with open(path, encoding="utf-8") as stream:
            return json.load(stream).get("error") is None
    except (OSError, ValueError, AttributeError):
        return False


def pending_jobs(jobs: Sequence[AudioJob], output_dir: str, output_format: str,
                 overwrite: bool) -> Tuple[List[AudioJob], int]:
    """The jobs still to run (all with `overwrite`) and how many were skipped as done."""
    if overwrite:
        return list(jobs), 0
    pending = [job for job in jobs if not is_done(output_path(output_dir, job, output_format), output_format)]
    return pending, len(jobs) - len(pending)


class OutputWriter:
    """Writes each result to its file as it arrives and keeps the failures for the report at the end. A failed
    input gets no file, except a json error record. subtitles: how srt/vtt cues are cut (an int:
    max_words_per_line)."""

    def __init__(self, jobs: Sequence[AudioJob], output_dir: str, output_format: str,
                 subtitles: Union[SubtitleOptions, int, None] = None) -> None:
        self.jobs = jobs
        self.subtitles = subtitles
        self.output_dir = output_dir
        self.output_format = output_format
        self.failures: List[Tuple[str, str]] = []  # (source, error)
        self.written = 0

    def __call__(self, index: int, result: TranscriptionResult) -> None:
        job = self.jobs[index]
        if result.error is not None:
            self.failures.append((job.source, result.error))
            if self.output_format != "json":
                return
        write_atomic(output_path(self.output_dir, job, self.output_format),
                     render(result, self.output_format, self.subtitles))
        self.written += 1


def report_failures(failures: Sequence[Tuple[str, str]], total: int, err: TextIO) -> None:
    """One line per failed input (its error names it), then a count; nothing when all succeeded."""
    if not failures:
        return
    for source, error in failures:
        message = error if error.startswith(f"{source}:") else f"{source}: {error}"
        err.write(f"seq2seq-engine transcribe: {message}\n")
    err.write(f"seq2seq-engine transcribe: {len(failures)} of {total} input(s) failed\n")
    err.flush()
