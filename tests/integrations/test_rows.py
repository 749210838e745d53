"""Rows of a Ray Data batch to engine inputs and results back (seq2seq_engine/integrations/rows.py), without a
cluster: the values Ray Data hands over (numpy arrays, NaN for None, floats for ints with gaps, dicts with every
key), per-row errors naming the field, and results that survive the trip unchanged; the Ray flags' checks."""
import math

import numpy as np
import pytest

from seq2seq_engine.entrypoints.cli import main
from seq2seq_engine.integrations.ray_data import ReplicaConfig
from seq2seq_engine.integrations.ray_jobs import RayJob
from seq2seq_engine.integrations.rows import (audio_options, audio_source, batch_to_rows, prompt_of_row, relabel,
                                              result_to_row, row_to_result, sampling_of_row)
from seq2seq_engine.transcription.options import TranscriptionOptions
from seq2seq_engine.transcription.output.results import Segment, TranscriptionResult, Word


def test_a_batch_becomes_plain_rows_with_none_where_ray_data_wrote_nan():
    batch = {"id": np.array([0, 1]), "max_tokens": np.array([3.0, math.nan]),
             "token_ids": np.array([np.array([1, 2]), np.array([3])], dtype=object),
             "bytes": np.array([b"RIFF", None], dtype=object)}
    rows = batch_to_rows(batch)
    assert rows == [{"id": 0, "max_tokens": 3.0, "token_ids": [1, 2], "bytes": b"RIFF"},
                    {"id": 1, "max_tokens": None, "token_ids": [3], "bytes": None}]
    assert type(rows[0]["id"]) is int and batch_to_rows({}) == []


def test_audio_rows_name_their_input_and_options():
    assert audio_source({"path": "a.wav", "bytes": None}) == "a.wav"
    assert audio_source({"path": "a.wav", "bytes": b"xyz"}) == b"xyz"  # the path then only names the bytes
    with pytest.raises(ValueError, match="'path' or 'bytes'"):
        audio_source({"path": None})
    with pytest.raises(TypeError, match="'path' must be a str"):
        audio_source({"path": 3})
    base = TranscriptionOptions(max_new_tokens=10)
    options = audio_options(base, {"options": {"timestamps": True}, "language": "en", "task": None})
    assert (options.timestamps, options.language, options.task, options.max_new_tokens) == (True, "en",
                                                                                            "transcribe", 10)
    with pytest.raises(TypeError, match="unknown transcription option"):
        audio_options(base, {"options": {"beams": 2}})
    with pytest.raises(ValueError, match="task must be one of"):
        audio_options(base, {"task": "dance"})


def test_a_result_survives_the_row_at_full_precision():
    words = [Word(0.1234567, 0.5, " Hi", 0.987654321)]
    result = TranscriptionResult("Hi.", "en", [Segment(0.0, 1.0004999, "Hi.", 0.0, -0.123456789, 0.5, 0.01, words)],
                                 None, 1.0004999, 0.75, "a.wav")
    row = result_to_row(result)
    assert row["words"] == [{"start": 0.1234567, "end": 0.5, "word": " Hi", "probability": 0.987654321,
                             "segment": 0}]
    back = row_to_result({**row, "language_probability": math.nan, "segments": np.array(row["segments"])})
    assert back == TranscriptionResult("Hi.", "en", result.segments, None, 1.0004999, None, "a.wav")
    assert back.segments[0].avg_logprob == -0.123456789 and back.segments[0].words == words
    failed = TranscriptionResult("", None, [], "<input 3>: cannot decode audio", 0.0, None, "<input 3>")
    assert relabel(failed, "x.mp3").error == "x.mp3: cannot decode audio" and relabel(failed, "x.mp3").source == "x.mp3"


def test_prompt_rows_give_the_prompt_and_the_sampling_overrides():
    assert prompt_of_row({"prompt": "hi", "encoder_prompt": None}) == "hi"
    assert prompt_of_row({"prompt": [1, 2]}) == {"prompt_token_ids": [1, 2]}
    assert prompt_of_row({"prompt": {"prompt": "hi", "prompt_token_ids": None}}) == {"prompt": "hi"}
    assert prompt_of_row({"prompt_token_ids": [5]}) == {"prompt_token_ids": [5]}
    assert prompt_of_row({"encoder_prompt": "doc", "decoder_prompt": [2]}) == {
        "encoder_prompt": "doc", "decoder_prompt": {"prompt_token_ids": [2]}}
    assert prompt_of_row({"prompt_json": '{"prompt": "hi", "prompt_token_ids": null}'}) == {
        "prompt": "hi", "prompt_token_ids": None}  # kept exactly: the engine refuses it as on one machine
    with pytest.raises(ValueError, match="'prompt_json' must be JSON text"):
        prompt_of_row({"prompt_json": "{oops"})
    with pytest.raises(ValueError, match="needs a 'prompt'"):
        prompt_of_row({"prompt": None})
    params = sampling_of_row({"temperature": 0.0, "max_tokens": 8}, {"max_tokens": 3.0, "top_p": 0.5, "seed": None})
    assert params == {"temperature": 0.0, "max_tokens": 3, "top_p": 0.5} and type(params["max_tokens"]) is int


def test_job_and_replica_settings_are_checked(tmp_path, capsys):
    with pytest.raises(ValueError, match="num_replicas"):
        RayJob(num_replicas=0)
    with pytest.raises(ValueError, match="cpus_per_replica"):
        RayJob(cpus_per_replica=0)
    with pytest.raises(ValueError, match="model"):
        ReplicaConfig("")
    with pytest.raises(TypeError, match="TranscriptionOptions"):
        ReplicaConfig("m", transcription={"language": "en"})
    assert main(["transcribe", str(tmp_path / "a.wav"), "--ray", "--num-replicas", "0", "--quiet"]) == 2
    assert "num_replicas (--num-replicas) must be an int >= 1, got 0" in capsys.readouterr().err
