"""The multipart form of /v1/audio/transcriptions and /translations: OpenAI's fields (file, model, language, prompt,
temperature, response_format, timestamp_granularities[]), any TranscriptionOptions field as an extra field (or
faster-whisper's / openai-whisper's name of it: option_aliases.py), and the srt/vtt cue fields (SubtitleOptions:
max_line_width, max_line_count, max_words_per_line, highlight_words), each within its bound (limits.py)."""
from __future__ import annotations

import contextlib
import dataclasses
import json
import math
from typing import Any, AsyncIterator, Dict, List, Optional

from starlette.datastructures import FormData, UploadFile
from starlette.formparsers import MultiPartException, MultiPartParser
from starlette.requests import Request

from seq2seq_engine.entrypoints.openai.errors import APIError, check_size
from seq2seq_engine.entrypoints.openai.limits import (MAX_AUDIO_PROMPT_CHARS, MAX_CLIP_TIMESTAMPS, MAX_FORM_FIELD_BYTES,
                                                      MAX_FORM_FIELDS, MAX_FORM_FILES, MAX_LANGUAGE_CHARS,
                                                      MAX_MODEL_CHARS, MAX_PART_HEADER_LINE_BYTES, MAX_PART_HEADERS,
                                                      MAX_TEMPERATURES, MAX_TIMESTAMP_GRANULARITIES,
                                                      MAX_VAD_PARAMETERS_CHARS, MAX_VOCABULARY_IDS)
from seq2seq_engine.errors import param_of
from seq2seq_engine.sampling_params import INT64_MAX
from seq2seq_engine.transcription.option_aliases import (ALIASES, NEUTRAL, is_neutral, option_name, resolve_aliases,
                                                         unknown_message)
from seq2seq_engine.transcription.options import TranscriptionOptions, field_names
from seq2seq_engine.transcription.output.subtitles import SubtitleOptions

RESPONSE_FORMATS = ("json", "text", "srt", "vtt", "verbose_json")
GRANULARITIES = ("segment", "word")
STREAMED_FORMATS = ("json", "text", "verbose_json")  # srt/vtt need the whole result
_BOOLS = ("condition_on_previous_text", "skip_silence", "suppress_blank", "vad_filter", "word_timestamps")
_INTS = ("max_new_tokens", "beam_width", "best_of", "seed")
_OPTIONAL_FLOATS = ("compression_ratio_threshold", "log_prob_threshold", "no_speech_threshold",
                    "prompt_reset_on_temperature", "hallucination_silence_threshold")
_TEXTS = ("prefix", "hotwords", "clip_timestamps", "suppress_tokens")
# The form field of each TranscriptionOptions field whose name differs (the others: the same name), and the fields
# the endpoint or the server sets (a refusal naming one of them names no form field).
_FORM_FIELDS = {"initial_prompt": "prompt", "lora_request": "model"}
_SET_BY_SERVER = ("task", "timestamps", "use_tqdm", "word_timestamps", "max_in_flight", "max_audio_seconds")
_SUBTITLE_INTS = ("max_line_width", "max_line_count", "max_words_per_line")
_SUBTITLE_FIELDS = _SUBTITLE_INTS + ("highlight_words",)
# Set by the endpoint or the server itself, never by a form field.
_RESERVED = ("task", "timestamps", "use_tqdm", "max_in_flight", "initial_prompt")
# The fields of OpenAI's transcription form; the others set TranscriptionOptions fields (or their aliases).
_OPENAI_FIELDS = ("file", "model", "response_format", "timestamp_granularities[]", "timestamp_granularities",
                  "language", "prompt", "temperature", "stream")
# faster-whisper's / openai-whisper's names of the extra fields (option_aliases.py); those of reserved fields are
# refused as the fields are.
_FORM_ALIASES = tuple(name for name, alias in ALIASES.items() if alias.option not in _RESERVED + _SET_BY_SERVER)
# Each text field's bound below the part size: (limit, unit); "characters" counts the text, the rest its
# comma-separated items.
_FIELD_BOUNDS = {"model": (MAX_MODEL_CHARS, "characters"), "language": (MAX_LANGUAGE_CHARS, "characters"),
                 "prompt": (MAX_AUDIO_PROMPT_CHARS, "characters"), "hotwords": (MAX_AUDIO_PROMPT_CHARS, "characters"),
                 "prefix": (MAX_AUDIO_PROMPT_CHARS, "characters"), "temperature": (MAX_TEMPERATURES, "temperatures"),
                 "clip_timestamps": (MAX_CLIP_TIMESTAMPS, "numbers"),
                 "suppress_tokens": (MAX_VOCABULARY_IDS, "token ids"),
                 "vad_parameters": (MAX_VAD_PARAMETERS_CHARS, "characters")}


class _BoundedMultiPartParser(MultiPartParser):
    """starlette's multipart parser with the form's bounds (limits.py) as 400s naming the part past them."""

    def __init__(self, request: Request) -> None:
        super().__init__(request.headers, request.stream(), max_files=math.inf, max_fields=math.inf,
                         max_part_size=MAX_FORM_FIELD_BYTES)  # on_part_data checks it first, naming the part

    def on_headers_finished(self) -> None:
        super().on_headers_finished()
        name = self._current_part.field_name
        if self._current_part.file is not None:
            check_size(name, self._current_files, MAX_FORM_FILES, "files", subject="the form")
        else:
            check_size(name, self._current_fields, MAX_FORM_FIELDS, "text fields", subject="the form")

    def on_part_data(self, data: bytes, start: int, end: int) -> None:
        part = self._current_part
        if part.file is None:
            check_size(part.field_name, len(part.data) + end - start, MAX_FORM_FIELD_BYTES, "bytes")
        super().on_part_data(data, start, end)


@contextlib.asynccontextmanager
async def bounded_form(request: Request) -> AsyncIterator[FormData]:
    """The request's multipart form within the bounds of limits.py (an empty form for any other body: no `file`);
    its files are closed on leaving."""
    form = FormData()
    if request.headers.get("content-type", "").split(";")[0].strip().lower() == "multipart/form-data":
        try:
            form = await _BoundedMultiPartParser(request).parse()
        except MultiPartException as error:
            raise APIError(f"the multipart body is malformed or a part has a header line over "
                           f"{MAX_PART_HEADER_LINE_BYTES} bytes or over {MAX_PART_HEADERS} headers: {error.message}",
                           param="file") from None
    try:
        yield form
    finally:
        await form.close()


def _check_field_bounds(form: FormData, granularities: List[Any]) -> None:
    check_size("timestamp_granularities[]", len(granularities), MAX_TIMESTAMP_GRANULARITIES, "values")
    for name, (limit, unit) in _FIELD_BOUNDS.items():
        for value in form.getlist(name):
            if isinstance(value, str):
                size = len(value) if unit == "characters" else sum(1 for part in value.split(",") if part.strip())
                check_size(name, size, limit, unit)


@dataclasses.dataclass(frozen=True)
class AudioRequest:
    data: bytes
    filename: str
    model: Optional[str]
    response_format: str
    words: bool
    subtitles: SubtitleOptions
    options: TranscriptionOptions
    stream: bool = False


def _bool(name: str, text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("true", "1", "yes", "on"):
        return True
    if lowered in ("false", "0", "no", "off"):
        return False
    raise APIError(f"{name} must be true or false, got {text!r}", param=name)


def _number(name: str, text: str, kind: type) -> Any:
    """A form field as a number; every integer field is a count, a size or a seed: 0 to 2**63-1 (int64)."""
    if kind is float and text.strip().lower() == "none":
        return None
    try:
        value = kind(text)
    except ValueError:
        raise APIError(f"{name} must be {'an integer' if kind is int else 'a number'}, got {text[:100]!r}",
                       param=name) from None
    if kind is int and not 0 <= value <= INT64_MAX:
        raise APIError(f"{name} must be an integer from 0 to 2**63-1, got {value}", param=name)
    return value


def _extra_field(name: str, text: str) -> Any:
    if name in _BOOLS:
        return _bool(name, text)
    if name in _INTS:
        return _number(name, text, int)
    if name in _OPTIONAL_FLOATS:
        return _number(name, text, float)
    if name in _TEXTS:
        return text
    if name == "vad_parameters":
        try:
            return json.loads(text)
        except (ValueError, RecursionError):  # RecursionError: arrays nested deeper than the interpreter's stack
            raise APIError("vad_parameters must be a JSON object", param=name) from None
    known = _BOOLS + _INTS + _OPTIONAL_FLOATS + _TEXTS + ("vad_parameters",) + _FORM_ALIASES + _SUBTITLE_FIELDS
    raise APIError(unknown_message(name, known + _OPENAI_FIELDS, kind="field", hint=False), param=name)


def _neutral_field(name: str, text: Optional[str]) -> bool:
    """Another tool's setting we lack, sent at a value that changes nothing here (option_aliases.NEUTRAL: "1",
    "1.0", "false", "null", ...): dropped, as the Python keywords drop it."""
    if name not in NEUTRAL or text is None:
        return False
    try:
        return is_neutral(name, json.loads(text.strip().lower()))
    except (ValueError, RecursionError):
        return False


def _single(form: FormData, name: str) -> Optional[str]:
    values = form.getlist(name)
    if len(values) > 1:
        raise APIError(f"{name} was sent {len(values)} times", param=name)
    if values and not isinstance(values[0], str):
        raise APIError(f"{name} must be a text field, not a file", param=name)
    return values[0] if values else None


async def parse_audio_form(form: FormData, task: str, max_upload_bytes: int) -> AudioRequest:
    upload = form.get("file")
    if not isinstance(upload, UploadFile):
        raise APIError("file is required: the audio file as a multipart upload", param="file")
    data = await upload.read()
    if len(data) > max_upload_bytes:
        raise APIError(f"the file has {len(data)} bytes, more than the server's limit of {max_upload_bytes}",
                       413, param="file", code="file_too_large")
    if not data:
        raise APIError("the file is empty", param="file")
    granularities = form.getlist("timestamp_granularities[]") + form.getlist("timestamp_granularities")
    _check_field_bounds(form, granularities)
    response_format = _single(form, "response_format") or "json"
    if response_format not in RESPONSE_FORMATS:
        raise APIError(f"response_format must be one of {', '.join(RESPONSE_FORMATS)}, got {response_format!r}",
                       param="response_format")
    for granularity in granularities:
        if granularity not in GRANULARITIES:
            raise APIError(f"timestamp_granularities[] takes {' and '.join(GRANULARITIES)}, got {granularity!r}",
                           param="timestamp_granularities[]")
    stream = _bool("stream", _single(form, "stream") or "false")
    if stream and response_format not in STREAMED_FORMATS:
        raise APIError(f"stream=true sends text events: response_format must be one of {STREAMED_FORMATS}, got "
                       f"{response_format!r}", param="stream")
    subtitles = _subtitles(form)
    return AudioRequest(data, upload.filename or "audio", _single(form, "model"), response_format,
                        "word" in granularities, subtitles,
                        _options(form, task, response_format, granularities, subtitles), stream)


def _subtitles(form: FormData) -> SubtitleOptions:
    """The srt/vtt cue fields (ignored by the other formats), checked whatever the format: a 400 naming the field."""
    fields: Dict[str, Any] = {name: _number(name, text, int) for name in _SUBTITLE_INTS
                              if (text := _single(form, name)) is not None}
    highlight = _single(form, "highlight_words")
    if highlight is not None:
        fields["highlight_words"] = _bool("highlight_words", highlight)
    try:
        return SubtitleOptions(**fields)
    except ValueError as error:
        raise APIError(str(error), param=param_of(error)) from None


def _options(form: FormData, task: str, response_format: str, granularities: List[str],
             subtitles: SubtitleOptions) -> TranscriptionOptions:
    subtitled = response_format in ("srt", "vtt")
    fields: Dict[str, Any] = {"task": task, "use_tqdm": False,
                              "timestamps": subtitled or response_format == "verbose_json" or bool(granularities),
                              "word_timestamps": "word" in granularities or (subtitled and subtitles.highlight_words)}
    language, prompt, temperature = (_single(form, name) for name in ("language", "prompt", "temperature"))
    if language:
        fields["language"] = language
    if prompt:
        fields["initial_prompt"] = prompt
    if temperature is not None:
        fields["temperature"] = temperature  # "0" or "0,0.2,0.4": TranscriptionOptions parses both
    extras: Dict[str, Any] = {}
    for name in sorted({key for key in form.keys() if key not in _OPENAI_FIELDS + _SUBTITLE_FIELDS}):
        if option_name(name) in _RESERVED:
            raise APIError(f"{name} is set by the endpoint and response_format, not by a field", param=name)
        text = _single(form, name)
        if not _neutral_field(name, text):
            extras[name] = _extra_field(option_name(name), text)  # a bad value names the option's field
    try:
        fields.update(resolve_aliases(extras, field_names()))  # beam_size and beam_width both: the same value
        return TranscriptionOptions(**fields)
    except (ValueError, TypeError) as error:
        raise APIError(str(error), param=options_param(error)) from None


def options_param(error: BaseException) -> Optional[str]:
    """The form field behind the TranscriptionOptions (or Whisper prompt) field `error` names; None for the fields
    the server sets and for errors about no one field."""
    name = param_of(error)
    if name is None or name in _SET_BY_SERVER:
        return None
    return _FORM_FIELDS.get(name, name)
