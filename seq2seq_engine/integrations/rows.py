"""Rows of a Ray Data batch as engine inputs, and engine results as rows (audio rows and prompt rows), both ways."""
from __future__ import annotations

import dataclasses
import json
import math
from typing import Any, Dict, List, Mapping, Optional, Tuple

import numpy as np

from seq2seq_engine.transcription.options import TranscriptionOptions, resolve_options
from seq2seq_engine.transcription.output.results import Segment, TranscriptionResult, Word

# Sampling fields a prompt row may set (None: the replica's default); the `generate` flags' names.
SAMPLING_FIELDS = ("max_tokens", "min_tokens", "beam_width", "length_penalty", "no_repeat_ngram_size",
                   "repetition_penalty", "temperature", "top_p", "top_k", "seed")
# The source of a `bytes` row without a `path` (a row's `path` names its bytes when both are given).
BYTES_LABEL = "<bytes>"
INT_SAMPLING_FIELDS = frozenset({"max_tokens", "min_tokens", "beam_width", "no_repeat_ngram_size", "top_k", "seed"})
# Output columns: input columns of the same name are replaced; every other input column but `bytes` passes through.
AUDIO_OUTPUT_COLUMNS = ("source", "text", "language", "language_probability", "duration", "segments", "words",
                        "error")
PROMPT_OUTPUT_COLUMNS = ("prompt_text", "text", "token_ids", "finish_reason", "cumulative_logprob", "alternatives",
                         "error")


def plain(value: Any) -> Any:
    """A value of a batch column as plain Python: numpy scalars and arrays to Python scalars and lists, and NaN to
    None (Ray Data turns a column of None into NaN)."""
    if isinstance(value, np.ndarray):
        return [plain(item) for item in value.tolist()] if value.dtype == object else value.tolist()
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(item) for item in value]
    return value


def batch_to_rows(batch: Mapping[str, Any]) -> List[Dict[str, Any]]:
    """A batch (dict of columns: numpy arrays or lists) as one dict per row, in plain Python values."""
    columns = {name: list(values) for name, values in batch.items()}
    num_rows = len(next(iter(columns.values()))) if columns else 0
    return [{name: plain(values[index]) for name, values in columns.items()} for index in range(num_rows)]


def rows_to_batch(rows: List[Dict[str, Any]], columns: List[str]) -> Dict[str, list]:
    """Rows as a dict of columns (each a list of the rows' values, None where a row has none)."""
    return {name: [row.get(name) for row in rows] for name in columns}


def passthrough_columns(batch: Mapping[str, Any], written: Tuple[str, ...]) -> List[str]:
    """The input columns copied to the output: all but the audio bytes and those the output replaces."""
    return [name for name in batch if name != "bytes" and name not in written] + list(written)


# ------------------------------------------------------------------------------------------------------ audio rows
def audio_source(row: Mapping[str, Any]) -> Any:
    """The input `transcribe` reads for a row: its `bytes` (a file's content; its `path`, if given, only names it),
    else its `path`."""
    if row.get("bytes") is not None:
        content = row["bytes"]
        if not isinstance(content, (bytes, bytearray)):
            raise TypeError(f"an audio row's 'bytes' must be the file's bytes, got {type(content).__name__}")
        return bytes(content)
    if row.get("path") is not None:
        if not isinstance(row["path"], str):
            raise TypeError(f"an audio row's 'path' must be a str, got {type(row['path']).__name__}")
        return row["path"]
    raise ValueError("an audio row needs a 'path' or 'bytes' column with a value")


def audio_options(base: TranscriptionOptions, row: Mapping[str, Any]) -> TranscriptionOptions:
    """The replica's options with the row's `options` (a dict of TranscriptionOptions fields), then its `language`
    and `task`, applied; a bad field or value is a ValueError/TypeError naming it."""
    overrides = dict(row.get("options") or {})
    if not isinstance(row.get("options") or {}, dict):
        raise TypeError(f"an audio row's 'options' must be a dict of TranscriptionOptions fields, got "
                        f"{type(row['options']).__name__}")
    overrides.update({name: row[name] for name in ("language", "task") if row.get(name) is not None})
    return resolve_options(base, overrides)


def result_to_row(result: TranscriptionResult) -> Dict[str, Any]:
    """A result's output columns; floats at full precision, so `row_to_result` gives back an equal result."""
    segments = [dataclasses.asdict(segment) for segment in result.segments]
    words = [dict(word, segment=number) for number, segment in enumerate(segments)
             for word in segment["words"] or []]
    return {"source": result.source, "text": result.text, "language": result.language,
            "language_probability": result.language_probability, "duration": result.duration,
            "segments": segments, "words": words, "error": result.error}


def relabel(result: TranscriptionResult, label: str) -> TranscriptionResult:
    """The result of a bytes input named `label` instead of its place in the batch ("<input 3>"), errors too."""
    error = result.error
    if error is not None and result.source and error.startswith(f"{result.source}:"):
        error = label + error[len(result.source):]
    return dataclasses.replace(result, source=label, error=error)


def error_row(error: str) -> Dict[str, Any]:
    """The output columns of a row that could not be run: its error, no text."""
    return {"text": "", "segments": [], "words": [], "error": error}


def row_to_result(row: Mapping[str, Any]) -> TranscriptionResult:
    """The TranscriptionResult an output row of TranscribeBatch holds (as `transcribe` returned it on the replica)."""
    row = {name: plain(value) for name, value in row.items()}
    segments = []
    for segment in row.get("segments") or []:
        words = segment.pop("words", None)
        segments.append(Segment(**segment, words=None if words is None else [Word(**word) for word in words]))
    return TranscriptionResult(row.get("text") or "", row.get("language"), segments, row.get("error"),
                               float(row.get("duration") or 0.0), row.get("language_probability"),
                               row.get("source"))


# ----------------------------------------------------------------------------------------------------- prompt rows
def prompt_of_row(row: Mapping[str, Any]) -> Any:
    """The engine prompt of a row: `prompt_json` (any prompt of the Python API as JSON text, as a line of a .jsonl
    input: kept exactly), `encoder_prompt` (+ `decoder_prompt`), `prompt_token_ids`, or `prompt` (a text, a list
    of token ids, or a prompt dict; keys whose value is None are dropped, as Arrow gives every dict of a column
    every key of the others)."""
    if row.get("prompt_json") is not None:
        try:
            return json.loads(row["prompt_json"])
        except (TypeError, ValueError) as error:
            raise ValueError(f"a prompt row's 'prompt_json' must be JSON text: {error}") from None
    if row.get("encoder_prompt") is not None:
        return {"encoder_prompt": _prompt_value(row["encoder_prompt"]),
                "decoder_prompt": _prompt_value(row.get("decoder_prompt"))}
    if row.get("prompt_token_ids") is not None:
        return {"prompt_token_ids": row["prompt_token_ids"]}
    if row.get("prompt") is not None:
        return _prompt_value(row["prompt"])
    raise ValueError("a prompt row needs a 'prompt', 'prompt_token_ids' or 'encoder_prompt' column with a value")


def _prompt_value(value: Any) -> Any:
    if isinstance(value, list):
        return {"prompt_token_ids": value}
    if isinstance(value, dict):
        return {key: item for key, item in value.items() if item is not None}
    return value


def sampling_of_row(defaults: Mapping[str, Any], row: Mapping[str, Any]) -> Dict[str, Any]:
    """The request's sampling overrides: the replica's, then the row's SAMPLING_FIELDS that have a value (a whole
    float in an int field back to an int: a column of ints with gaps reaches the batch as floats)."""
    given = {name: row[name] for name in SAMPLING_FIELDS if row.get(name) is not None}
    for name in INT_SAMPLING_FIELDS.intersection(given):
        if isinstance(given[name], float) and given[name].is_integer():
            given[name] = int(given[name])
    return {**defaults, **given}


def output_to_row(fields: Mapping[str, Any]) -> Dict[str, Any]:
    """A finished request's output columns, from output_records.result_fields (its `prompt` becomes `prompt_text`)."""
    return {"prompt_text": fields["prompt"], "text": fields["text"], "token_ids": fields["token_ids"],
            "finish_reason": fields["finish_reason"], "cumulative_logprob": fields["cumulative_logprob"],
            "alternatives": fields.get("alternatives", []), "error": None}


def row_to_fields(row: Mapping[str, Any]) -> Optional[Dict[str, Any]]:
    """output_records.result_fields of the request a GenerateBatch output row holds; None for a row with an error."""
    if row.get("error") is not None:
        return None
    fields = {"prompt": row.get("prompt_text"), "text": row.get("text"), "token_ids": plain(row.get("token_ids")),
              "finish_reason": row.get("finish_reason"), "cumulative_logprob": row.get("cumulative_logprob")}
    alternatives = plain(row.get("alternatives") or [])
    if alternatives:
        fields["alternatives"] = alternatives
    return fields
