"""POST /v1/audio/transcriptions and /v1/audio/translations: the upload runs as a TranscriptionJob on the engine loop
(beside the text requests) and comes back as json, text, srt, vtt or verbose_json."""
from __future__ import annotations

import dataclasses
import math
from typing import Any, AsyncIterator, Callable, Dict, Optional

from fastapi.responses import JSONResponse, PlainTextResponse
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request

from seq2seq_engine.audio.stream import declared_seconds
from seq2seq_engine.entrypoints.openai.audio_form import AudioRequest, bounded_form, options_param, parse_audio_form
from seq2seq_engine.entrypoints.openai.client import job_messages, run_job
from seq2seq_engine.entrypoints.openai.errors import APIError
from seq2seq_engine.entrypoints.openai.event_stream import EventStreamResponse, sse
from seq2seq_engine.entrypoints.openai.sink import InputProgress, InputResult
from seq2seq_engine.entrypoints.openai.state import ServedModels, ServerState, Target
from seq2seq_engine.transcription.job import TranscriptionJob
from seq2seq_engine.transcription.language_table import LANGUAGES
from seq2seq_engine.transcription.options import TranscriptionOptions
from seq2seq_engine.transcription.output.results import FailureKind, TranscriptionResult, render


async def create_transcription(request: Request, models: ServedModels, task: str):
    if not any(state.takes_audio for state in models.states):
        raise APIError(f"no model of this server takes audio (none is a Whisper model): {list(models.names)}",
                       param="model")
    async with bounded_form(request) as form:
        audio = await parse_audio_form(form, task, models.settings.max_upload_bytes)
    if audio.model is None:
        raise APIError("model is required", param="model")
    _audio_model(models, audio.model)
    limit = models.settings.max_audio_seconds
    declared = await run_in_threadpool(declared_seconds, audio.data)  # the header only: no decoding
    if declared is not None and declared > limit:
        raise _too_long(audio, limit)
    target = _audio_model(models, audio.model)  # again: a LoRA adapter may have been unloaded meanwhile
    state = target.state
    _check_engine_bounds(audio.options, state)
    try:
        options = dataclasses.replace(audio.options, max_audio_seconds=limit if math.isfinite(limit) else None,
                                      lora_request=target.lora)
        job = TranscriptionJob(state.engine, [audio.data], options, stream=audio.stream)
    except (ValueError, TypeError) as error:
        raise APIError(str(error), param=options_param(error)) from None
    headers = {"X-Request-Id": request.headers["x-request-id"]} if "x-request-id" in request.headers else None
    release = models.loras.hold(target.lora)  # the adapter stays loaded while the job runs
    if audio.stream:
        return await _stream(state, job, request, audio, headers, release)
    try:
        [(_, result)] = await run_job(state.loop, job, request)
    finally:
        release()
    _check_decoded(result, audio, limit)
    if audio.response_format in ("text", "srt", "vtt"):
        text = render(result, {"text": "txt"}.get(audio.response_format, audio.response_format),
                      audio.subtitles)
        return PlainTextResponse(text, headers=headers)
    if audio.response_format == "json":
        return JSONResponse({"text": result.text, "usage": _usage(result)}, headers=headers)
    return JSONResponse(verbose_json(result, audio, task), headers=headers)


def _audio_model(models: ServedModels, name: str) -> Target:
    """The Whisper model (or LoRA adapter on one) a form names; 404 for an unknown name, 400 for a text model."""
    target = models.target(name)
    if not target.state.takes_audio:
        raise APIError(f"the model {target.name!r} takes no audio (it is not a Whisper model)", param="model")
    return target


def _check_engine_bounds(options: TranscriptionOptions, state: ServerState) -> None:
    """The engine's bounds on a window's sequences (TranscriptionJob applies the same), as 400s naming the field."""
    engine = state.engine
    if options.beam_width is not None and options.beam_width > engine.max_beam_width:
        raise APIError(f"beam_width is {options.beam_width}, more than this engine's max_beam_width of "
                       f"{engine.max_beam_width}", param="beam_width")
    if any(t > 0 for t in options.temperatures) and options.best_of > engine.max_num_seqs:
        raise APIError(f"best_of is {options.best_of}, more than this engine's max_num_seqs of {engine.max_num_seqs}"
                       f" (--max-num-seqs): all of a window's samples run in one step", param="best_of")


def _too_long(audio: AudioRequest, limit: float) -> APIError:
    return APIError(f"{audio.filename}: the audio lasts more than this server's limit of {limit:g} seconds "
                    f"(--max-audio-seconds)", 413, param="file", code="audio_too_long")


def _check_decoded(result: TranscriptionResult, audio: AudioRequest, limit: float) -> None:
    """A 413 for audio longer than the server's limit (the decoder stopped there), a 400 for audio it cannot read."""
    if result.failure is FailureKind.AUDIO_TOO_LONG:
        raise _too_long(audio, limit)
    if result.error is not None:
        raise APIError(f"{audio.filename}: {result.error.replace('<bytes>: ', '')}", param="file",
                       code="invalid_audio")


async def _stream(state: ServerState, job: TranscriptionJob, request: Request, audio: AudioRequest,
                  headers: Optional[Dict[str, str]], release: Callable[[], None]) -> EventStreamResponse:
    """The events of a streamed transcription. The response starts with the first message, so an upload that is
    not audio (its result comes first, with the error) is still a 400. `release` runs once the job has ended."""
    messages = job_messages(state.loop, job, request)
    limit = state.settings.max_audio_seconds

    async def close() -> None:
        try:
            await messages.aclose()
        finally:
            release()

    try:
        first = await messages.__anext__()
        if isinstance(first, InputResult):
            _check_decoded(first.result, audio, limit)
    except BaseException:
        await close()
        raise
    return EventStreamResponse(transcript_events(first, messages, audio, limit), close, headers)


async def transcript_events(first: Any, messages: AsyncIterator[Any], audio: AudioRequest,
                            limit: float = math.inf) -> AsyncIterator[str]:
    """OpenAI's streamed transcription events: a `transcript.text.delta` as each run of windows becomes final (its
    text, and its segments as an extra field), then `transcript.text.done` with the whole text and the usage."""
    message: Any = first
    streamed = 0  # segments sent so far: their ids run on across events
    while message is not None:
        if isinstance(message, InputProgress):
            segments = [segment_json(streamed + k, segment) for k, segment in enumerate(message.segments)]
            streamed += len(segments)
            yield sse({"type": "transcript.text.delta", "delta": message.text, "segments": segments})
        else:
            _check_decoded(message.result, audio, limit)
            yield sse({"type": "transcript.text.done", "text": message.result.text,
                       "usage": _usage(message.result)})
        message = await messages.__anext__() if not isinstance(message, InputResult) else None


def _usage(result: TranscriptionResult) -> Dict[str, Any]:
    return {"type": "duration", "seconds": int(math.ceil(result.duration))}


def _language_name(code: str) -> str:
    return LANGUAGES.get(code, code)


def segment_json(number: int, segment: Any) -> Dict[str, Any]:
    """One verbose_json segment: times, text and the decoding scores of its window."""
    return {"id": number, "seek": int(round(segment.start * 100)), "start": segment.start, "end": segment.end,
            "text": segment.text, "tokens": [], "temperature": segment.temperature,
            "avg_logprob": segment.avg_logprob, "compression_ratio": segment.compression_ratio,
            "no_speech_prob": segment.no_speech_prob}


def verbose_json(result: TranscriptionResult, audio: AudioRequest, task: str) -> Dict[str, Any]:
    """OpenAI's verbose_json: task, language, duration, text, segments with the decoding scores, words if asked."""
    segments = [segment_json(number, segment) for number, segment in enumerate(result.segments)]
    body: Dict[str, Any] = {"task": task, "language": _language_name(result.language or ""),
                            "duration": result.duration, "text": result.text, "segments": segments,
                            "usage": _usage(result)}
    if audio.words:
        body["words"] = [{"word": word.word.strip(), "start": word.start, "end": word.end,
                          "probability": word.probability}
                         for segment in result.segments for word in segment.words or []]
    return body
