"""faster-whisper's and openai-whisper's option names in the Python API: the alias table, keyword options resolved
through it (conflicts and unknown names refused naming both / the closest name), and one real transcription."""
import os
from pathlib import Path

import pytest
from conftest import require_speech_clips

from seq2seq_engine.entrypoints.llm import LLM
from seq2seq_engine.errors import ParameterError, ParameterTypeError
from seq2seq_engine.integrations.rows import audio_options
from seq2seq_engine.transcription import pipeline
from seq2seq_engine.transcription.option_aliases import ALIASES, UNSUPPORTED, resolve_aliases
from seq2seq_engine.transcription.options import TranscriptionOptions, field_names, resolve_options

DOC = Path(__file__).resolve().parents[2] / "docs" / "transcription.md"


def test_the_table_maps_other_names_to_fields_and_the_docs_list_them():
    fields = set(field_names())
    for name, alias in ALIASES.items():
        assert alias.name == name and alias.option in fields and name not in fields and name not in UNSUPPORTED
    assert not set(UNSUPPORTED) & fields
    doc = DOC.read_text(encoding="utf-8")
    for name in list(ALIASES) + list(UNSUPPORTED):
        assert f"`{name}`" in doc or f"`--{name}`" in doc, f"docs/transcription.md does not name {name}"


@pytest.mark.parametrize("given, field, value", [
    ({"beam_size": 3}, "beam_width", 3), ({"logprob_threshold": -0.5}, "log_prob_threshold", -0.5),
    ({"logprob_threshold": None}, "log_prob_threshold", None), ({"sample_len": 40}, "max_new_tokens", 40),
    ({"log_progress": False}, "use_tqdm", False), ({"without_timestamps": False}, "timestamps", True),
    ({"without_timestamps": True}, "timestamps", False),
    ({"beam_size": 2, "beam_width": 2}, "beam_width", 2),  # both names, one value
    ({"without_timestamps": True, "timestamps": False}, "timestamps", False),
])
def test_keyword_options_take_the_other_names(given, field, value):
    assert getattr(TranscriptionOptions.from_kwargs(**given), field) == value
    assert getattr(resolve_options(TranscriptionOptions(seed=7), given), field) == value
    assert audio_options(TranscriptionOptions(), {"options": given}) == TranscriptionOptions.from_kwargs(**given)


@pytest.mark.parametrize("given, names", [
    ({"beam_size": 2, "beam_width": 3}, ("beam_size=2", "beam_width=3")),
    ({"log_prob_threshold": -1.0, "logprob_threshold": -0.5}, ("log_prob_threshold=-1.0", "logprob_threshold=-0.5")),
    ({"timestamps": True, "without_timestamps": True}, ("timestamps=True", "without_timestamps=True")),
])
def test_an_alias_and_its_field_with_different_values_are_refused(given, names):
    with pytest.raises(ParameterError) as caught:
        TranscriptionOptions.from_kwargs(**given)
    assert all(name in str(caught.value) for name in names), caught.value


@pytest.mark.parametrize("name, message", [
    ("beam_sise", "unknown transcription option 'beam_sise'; did you mean 'beam_size'?"),
    ("logprob_treshold", "did you mean 'logprob_threshold'?"),
    ("temprature", "did you mean 'temperature'?"),
    ("patience", "'patience' (faster-whisper, openai-whisper) is not supported here"),
    ("fp16", "is not supported here; the engine's dtype sets the precision"),
    ("xyzzy", "unknown transcription option 'xyzzy'; known: beam_size, beam_width"),
])
def test_an_unknown_name_is_a_type_error_naming_the_closest_one(name, message):
    with pytest.raises(TypeError) as caught:
        TranscriptionOptions.from_kwargs(**{name: 7})
    assert isinstance(caught.value, ParameterTypeError) and caught.value.param == name
    assert message in str(caught.value)


@pytest.mark.parametrize("given", [
    {"patience": 1}, {"patience": None}, {"length_penalty": 1.0}, {"repetition_penalty": 1},
    {"no_repeat_ngram_size": 0}, {"multilingual": False}, {"chunk_length": 30}, {"language_detection_segments": 1},
    {"carry_initial_prompt": False},
])
def test_their_settings_at_values_that_change_nothing_here_are_accepted(given):
    """faster-whisper's and openai-whisper's defaults spelt out (`patience=1`, ...) run here: dropped, nothing set."""
    assert TranscriptionOptions.from_kwargs(beam_size=3, **given) == TranscriptionOptions(beam_width=3)


@pytest.mark.parametrize("given, message", [
    ({"patience": 2.0}, "'patience' (faster-whisper, openai-whisper) is not supported here (only at None or 1.0,"),
    ({"patience": True}, "is not supported here"),          # a bool is not the number 1
    ({"multilingual": True}, "(only at False, what this engine does)"),
    ({"no_repeat_ngram_size": 3}, "(only at 0, what this engine does)"),
])
def test_their_settings_at_other_values_are_refused_naming_the_accepted_one(given, message):
    with pytest.raises(ParameterTypeError) as caught:
        TranscriptionOptions.from_kwargs(**given)
    assert message in str(caught.value), caught.value


def test_transcribe_keywords_are_checked_before_the_engine_is_touched():
    with pytest.raises(TypeError, match="did you mean 'beam_size'"):
        LLM.transcribe(object(), "a.wav", beam_sise=2)
    with pytest.raises(ParameterTypeError, match="without_timestamps must be True or False"):
        resolve_aliases({"without_timestamps": 1}, field_names())


@pytest.mark.usefixtures("one_thread")
def test_a_transcription_with_faster_whisper_names(tiny_llm, monkeypatch):
    seen = []
    job = pipeline.TranscriptionJob
    monkeypatch.setattr(pipeline, "TranscriptionJob", lambda engine, sources, options: seen.append(options)
                        or job(engine, sources, options))
    clip = os.path.join(require_speech_clips(), "en", "hello_world.wav")
    result, = tiny_llm.transcribe(clip, beam_size=2, temperature=0.0, without_timestamps=False, log_progress=False)
    assert (seen[0].beam_width, seen[0].timestamps, seen[0].use_tqdm) == (2, True, False)
    assert result.error is None and "hello" in result.text.lower() and result.segments[0].end > 0
