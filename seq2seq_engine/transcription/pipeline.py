"""`transcribe` and `iter_transcribe`: one TranscriptionJob driven on the engine with step() until it is done."""
from __future__ import annotations

from typing import Any, Dict, Iterator, List, Optional, Tuple

from seq2seq_engine.transcription.job import TranscriptionJob
from seq2seq_engine.transcription.options import TranscriptionOptions, resolve_options
from seq2seq_engine.transcription.output.results import TranscriptionResult
from seq2seq_engine.transcription.schedule.input_source import is_single_input


def _steps(job: TranscriptionJob) -> Iterator[None]:
    """Drive the engine for one job, pausing after each step (and at the end) for the inputs finished meanwhile."""
    try:
        while True:
            job.fill()
            if not job.in_flight:
                yield
                break
            for output in job.engine.step(finished_only=True):  # on_output reads finished requests only
                job.on_output(output)
            job.end_of_step()
            yield
    except BaseException:
        job.abort()
        raise
    finally:
        job.close()


def _run(job: TranscriptionJob) -> List[TranscriptionResult]:
    for _ in _steps(job):
        pass
    return job.results()


def _iter_results(job: TranscriptionJob) -> Iterator[Tuple[int, TranscriptionResult]]:
    """(input index, result) for each input as soon as it finishes; its bookkeeping is dropped then."""
    for _ in _steps(job):
        yield from job.take_finished()


def transcribe(llm: Any, audio: Any, options: Optional[TranscriptionOptions] = None,
               **overrides: Any) -> List[TranscriptionResult]:
    """Transcribe (or translate to English) each input with a Whisper model; one result per input, in order.

        results = transcribe(llm, ["a.wav", "b.mp3", (samples, 44100)], timestamps=True)
        results = transcribe(llm, audio, TranscriptionOptions(temperature=0.0, beam_width=5), language="de")
        results[0].text, results[0].segments, results[0].error

    llm: an `LLM` (or its `LLMEngine`) running a Whisper model with its tokenizer.
    audio: one input or a list; an input is a file path, raw file bytes, a 16 kHz mono array, or an
        (array, sample_rate) tuple. Files are any audio FFmpeg decodes (wav, flac, mp3, m4a/aac, ogg/opus, webm,
        the audio track of mp4/mkv video, ...), read 30 s at a time as decoding proceeds (whole, with vad_filter).
        Inputs that cannot be read give results with `.error` set.
    options: a TranscriptionOptions (default: its defaults); keyword overrides replace its fields, e.g.
        `transcribe(llm, files, language="de", timestamps=True, temperature=0.0, vad_filter=True)`. See
        TranscriptionOptions for every field; the defaults follow openai-whisper (temperature fallback 0.0 to 1.0,
        thresholds 2.4 / -1.0 / 0.6). `temperature=0.0` alone decodes each window once, greedily (or with beam
        search, beam_width > 1), as transformers' `generate` does.
    """
    return _run(_transcription(llm, audio, options, overrides))


def iter_transcribe(llm: Any, audio: Any, options: Optional[TranscriptionOptions] = None,
                    **overrides: Any) -> Iterator[Tuple[int, TranscriptionResult]]:
    """As `transcribe` (same options), but yields `(input index, result)` for each input as soon as it finishes (in
    the order they finish), so a caller can write each result out while the others run. Stopping the iteration early
    aborts the engine requests still running. Options are checked when it is called, before the first result."""
    return _iter_results(_transcription(llm, audio, options, overrides))


def _transcription(llm: Any, audio: Any, options: Optional[TranscriptionOptions],
                   overrides: Dict[str, Any]) -> TranscriptionJob:
    options = resolve_options(options, overrides)
    engine = getattr(llm, "llm_engine", llm)
    sources = [audio] if is_single_input(audio) else list(audio)
    return TranscriptionJob(engine, sources, options)
