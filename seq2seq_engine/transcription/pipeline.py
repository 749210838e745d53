"""Batch transcription: every window of every input through the engine as one continuous batch.

    results = transcribe(llm, ["a.wav", "b.mp3", (samples, 44100)], timestamps=True)
    for index, result in iter_transcribe(llm, paths, vad_filter=True): ...

How it runs (job.py's TranscriptionJob queues the requests; the loop here drives the engine with step(), so progress
is reported per window; the server drives the same job from its engine loop):

* Inputs are read lazily, in order, as the engine has room (`max_in_flight` requests at a time, by default as many
  as keep their KV cache within a budget: in_flight.py; input_queue.py).
  Each input is a stream of 30 s windows (the encoder's span; only the `clip_timestamps` spans when given) decoded
  only as far as the windows taken need, or with `vad_filter` its speech regions packed into windows
  (window_source.py, vad_windows.py). A window's samples are dropped once it is final, so memory holds the windows
  in flight. An input that cannot be read (AudioError, also part way through) gets a result with `.error` set.
* Language: given, or detected per input on its first window with speech with a 1-token request (language.py).
  English-only models use "en".
* Throughput mode (default): all windows of all inputs are independent requests. Sequential mode
  (`condition_on_previous_text=True`): an input's window k+1 is queued when window k is final, with
  `<|startofprev|>` + the text kept so far before its prompt; different inputs still run together.
* Each attempt decodes at one temperature (decode_params.py): greedy (or beam search) at 0, `best_of` seeded samples
  above, with Whisper's suppress / begin-suppress / timestamp rules as logits processors and a hook that reads
  P(<|nospeech|>) at the `<|startoftranscript|>` position. fallback.py judges the finished attempt: a failed one is
  queued again at the next temperature, ahead of the queue, while the batch's other windows keep decoding; a silent
  one keeps no text.
* Results are stitched per input (segments.py): timestamps shifted by each window's offset (or mapped through a
  packed window's TimeMap), texts joined, each segment carrying its window's temperature, avg_logprob,
  compression_ratio and no_speech_prob. `iter_transcribe` yields each input's result as soon as it finishes;
  `transcribe` returns them all in input order.
* Word timestamps (`word_timestamps=True`, word_timestamps.py): once a window's kept attempt is known, and before
  its samples are released, one alignment pass (the window's text tokens through the decoder with the alignment
  heads' cross-attention kept) times its words; they are mapped to the input like the segments.
"""
from __future__ import annotations

from typing import Any, Dict, Iterator, List, Optional, Tuple

from seq2seq_engine.transcription.job import TranscriptionJob
from seq2seq_engine.transcription.options import TranscriptionOptions, resolve_options
from seq2seq_engine.transcription.results import TranscriptionResult
from seq2seq_engine.transcription.work_items import is_single_input


def _steps(job: TranscriptionJob) -> Iterator[None]:
    """Drive the engine for one job, pausing after each step (and at the end) for the inputs finished meanwhile."""
    try:
        while True:
            job.fill()
            if not job.in_flight:
                yield
                break
            for output in job.engine.step():
                job.on_output(output)
            yield
    except BaseException:
        job.abort()
        raise
    finally:
        job.close()


def _run(job: TranscriptionJob) -> List[TranscriptionResult]:
    for _ in _steps(job):
        job.newly_finished.clear()
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
