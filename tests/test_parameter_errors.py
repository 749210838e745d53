"""The validators raise ParameterError / ParameterTypeError naming the parameter as the Python API spells it (their
messages unchanged), which `except ValueError` / `except TypeError` still catch and pickle keeps; no model needed."""
import pickle
from types import SimpleNamespace

import numpy as np
import pytest

from seq2seq_engine.audio.vad import VadOptions
from seq2seq_engine.beam_search_params import BeamSearchParams
from seq2seq_engine.engine.input_processor import InputProcessor
from seq2seq_engine.errors import ParameterError, ParameterTypeError, param_of
from seq2seq_engine.generation_defaults import GenerationDefaults
from seq2seq_engine.sampling_params import SamplingParams
from seq2seq_engine.transcription.decode.decode_params import suppress_ids
from seq2seq_engine.transcription.live.options import LiveOptions, TurnDetection
from seq2seq_engine.transcription.options import TranscriptionOptions
from seq2seq_engine.transcription.output.results import FailureKind
from seq2seq_engine.transcription.output.subtitles import SubtitleOptions
from seq2seq_engine.transcription.prompts import WhisperTokens
from seq2seq_engine.transcription.schedule.input_source import InputFailed, InputSource

# The tiny.en layout (as test_transcription_units.py), and the same ids as a multilingual model's.
EN = WhisperTokens(sot=50257, eot=50256, no_timestamps=50362, vocab_size=51864, max_target_positions=448,
                   is_multilingual=False, language_ids={"en": 50258, "zh": 50259, "de": 50260},
                   transcribe=50358, translate=50357, start_of_prev=50360, suppress_tokens=(1, 2, 7),
                   begin_suppress_tokens=(220, 50256), max_initial_timestamp_index=50)
MULTI = WhisperTokens(**{**EN.__dict__, "is_multilingual": True})


def _refused(build, error_type=ParameterError):
    with pytest.raises(error_type) as caught:
        build()
    return caught.value


def _param(build, error_type=ParameterError):
    return _refused(build, error_type).param


@pytest.mark.parametrize("fields, param", [
    ({"n": 0}, "n"), ({"temperature": float("nan")}, "temperature"), ({"top_p": 0.0}, "top_p"), ({"top_k": 0}, "top_k"),
    ({"max_tokens": 2, "min_tokens": 3}, "min_tokens"), ({"stop": [""]}, "stop"), ({"seed": -1}, "seed"),
    ({"logit_bias": {-1: 1.0}}, "logit_bias"), ({"bad_words": [" "]}, "bad_words"),
    ({"allowed_token_ids": [1], "forced_eos_token_id": 2}, "forced_eos_token_id"),
    ({"temperature": 0.0, "n": 2}, "best_of"), ({"bad_words_ids": [[]]}, "bad_words_ids"),
    ({"prompt_logits_hooks": [(-1, print)]}, "prompt_logits_hooks"),
])
def test_sampling_params_name_the_field(fields, param):
    assert _param(lambda: SamplingParams(**fields)) == param


@pytest.mark.parametrize("fields, param", [
    ({"max_tokens": "8"}, "max_tokens"), ({"top_p": "1"}, "top_p"), ({"logit_bias": [1]}, "logit_bias"),
    ({"logits_processors": [1]}, "logits_processors"),
])
def test_sampling_params_type_errors_name_the_field(fields, param):
    error = _refused(lambda: SamplingParams(**fields), ParameterTypeError)
    assert error.param == param and isinstance(error, TypeError) and not isinstance(error, ValueError)


def test_the_vocabulary_check_names_the_field():
    assert _param(lambda: SamplingParams(suppress_tokens=[500]).verify_token_ids(100)) == "suppress_tokens"
    params = SamplingParams(_bad_words_token_ids=[[7, 500]])
    assert _param(lambda: params.verify_token_ids(100)) == "bad_words"


@pytest.mark.parametrize("fields, param, error_type", [
    ({"beam_width": 0}, "beam_width", ParameterError), ({"temperature": 0.5}, "temperature", ParameterError),
    ({"length_penalty": 100.0}, "length_penalty", ParameterError),
    ({"early_stopping": "sometimes"}, "early_stopping", ParameterError),
    ({"no_repeat_ngram_size": -1}, "no_repeat_ngram_size", ParameterError),
    ({"ignore_eos": 1}, "ignore_eos", ParameterTypeError), ({"max_tokens": 1.5}, "max_tokens", ParameterTypeError),
])
def test_beam_search_params_name_the_field(fields, param, error_type):
    assert _param(lambda: BeamSearchParams(**{"beam_width": 2, "max_tokens": 8, **fields}), error_type) == param


def _processor():
    model_config = SimpleNamespace(skip_tokenizer_init=True, max_logprobs=2, vocab_size=100)
    scheduler_config = SimpleNamespace(max_beam_width=2, max_num_seqs=4)
    return InputProcessor(model_config, scheduler_config, None, GenerationDefaults())


@pytest.mark.parametrize("params, param", [
    (BeamSearchParams(beam_width=4, max_tokens=4), "beam_width"), (SamplingParams(stop=["."]), "stop"),
    (SamplingParams(n=8), "best_of"), (SamplingParams(logprobs=5), "logprobs"),
    (SamplingParams(prompt_logprobs=3), "prompt_logprobs"), (SamplingParams(bad_words=["no"]), "bad_words"),
    (SamplingParams(allowed_token_ids=[500]), "allowed_token_ids"),
])
def test_the_engine_request_checks_name_the_field(params, param):
    assert _param(lambda: _processor().process({"prompt_token_ids": [1, 2]}, params)) == param


def test_an_override_the_params_class_lacks_names_itself():
    defaults = GenerationDefaults()
    assert _param(lambda: defaults.request_params(3, 10, beam_width=2, top_p=0.5)) == "top_p"
    assert _param(lambda: defaults.request_params(3, 10, colour=1, shade=2)) == "colour"
    assert _param(lambda: defaults.request_params(3, 10, seed=-1)) == "seed"


@pytest.mark.parametrize("fields, param", [
    ({"best_of": 0}, "best_of"), ({"temperature": "a,b"}, "temperature"), ({"initial_prompt": "  "}, "initial_prompt"),
    ({"task": "dance"}, "task"), ({"no_speech_threshold": 2.0}, "no_speech_threshold"),
    ({"clip_timestamps": "3,1"}, "clip_timestamps"), ({"vad_parameters": {"colour": 1}}, "vad_parameters"),
])
def test_transcription_options_name_the_field(fields, param):
    assert _param(lambda: TranscriptionOptions(**fields)) == param


def test_transcription_options_keep_their_requirement_and_vad_types():
    error = _refused(lambda: TranscriptionOptions(best_of=0))
    assert (str(error), error.requirement) == ("best_of must be an int >= 1, got 0", "an int >= 1")
    assert _param(lambda: TranscriptionOptions(vad_parameters=[1]), ParameterTypeError) == "vad_parameters"
    assert _param(lambda: VadOptions.from_parameters("fast"), ParameterTypeError) == "vad_parameters"


@pytest.mark.parametrize("fields, param", [
    ({"max_line_width": 0}, "max_line_width"), ({"max_line_count": -1}, "max_line_count"),
    ({"max_words_per_line": True}, "max_words_per_line"), ({"highlight_words": 1}, "highlight_words"),
    ({"pause_seconds": -1.0}, "pause_seconds"),
])
def test_subtitle_options_name_the_field(fields, param):
    assert _param(lambda: SubtitleOptions(**fields)) == param


def test_a_subtitle_count_says_its_requirement_apart_from_none():
    error = _refused(lambda: SubtitleOptions(max_line_count=0))
    assert (str(error), error.requirement) == ("max_line_count must be an int >= 1 or None, got 0", "an int >= 1")


@pytest.mark.parametrize("build, param", [
    (lambda: LiveOptions(language=" "), "language"), (lambda: LiveOptions(prompt=5), "prompt"),
    (lambda: LiveOptions(prompt="x" * 40_000), "prompt"),
    (lambda: LiveOptions(interim_interval_s=0), "interim_interval_s"),
    (lambda: LiveOptions(max_decodes_in_flight=0), "max_decodes_in_flight"),
    (lambda: LiveOptions(turn_detection="vad"), "turn_detection"), (lambda: TurnDetection(threshold=1.5), "threshold"),
    (lambda: TurnDetection(silence_duration_ms=-1), "silence_duration_ms"),
    (lambda: TurnDetection(prefix_padding_ms=10_001), "prefix_padding_ms"),
])
def test_live_options_and_turn_detection_name_the_field(build, param):
    assert _param(build) == param


@pytest.mark.parametrize("build, param", [
    (lambda: EN.language_code("fr"), "language"), (lambda: EN.language_code(""), "language"),
    (lambda: MULTI.language_code("klingon"), "language"), (lambda: MULTI.prompt(language=None), "language"),
    (lambda: EN.prompt(task="translate"), "task"), (lambda: MULTI.prompt("de", task="dance"), "task"),
    (lambda: EN.max_new_tokens(4, 0), "max_new_tokens"), (lambda: suppress_ids([60_000], EN), "suppress_tokens"),
])
def test_the_whisper_checks_name_the_field(build, param):
    assert _param(build) == param


def test_the_errors_are_value_and_type_errors_that_survive_pickling():
    for error in (ParameterError("n must be >= 1, got 0", "n", ">= 1"), ParameterTypeError("n must be an int", "n")):
        back = pickle.loads(pickle.dumps(error))
        assert (type(back), str(back), back.param, back.requirement) == (type(error), str(error), "n",
                                                                         error.requirement)
    assert isinstance(ParameterError("m", "n"), ValueError) and not isinstance(ParameterError("m", "n"), TypeError)
    assert param_of(ValueError("n must be >= 1")) is None  # a message that starts with a name names nothing


def test_an_input_failure_carries_its_kind():
    source = InputSource([np.zeros(16000 * 3, np.float32), "missing.wav"], 480_000, (), None, False, False, False,
                         max_seconds=1.0)
    kinds = []
    for _ in range(2):
        state = source.open_next()
        with pytest.raises(InputFailed) as caught:
            source.read_window(state)
        kinds.append(caught.value.kind)
    source.close()
    assert kinds == [FailureKind.AUDIO_TOO_LONG, FailureKind.AUDIO]
