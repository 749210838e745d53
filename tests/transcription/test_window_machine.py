"""WindowMachine phase by phase on real engine outputs, and windows final in one step aligned together."""
import itertools
import os

import numpy as np
import pytest
from conftest import require_model, require_speech_clips

from seq2seq_engine.audio import load_audio
from seq2seq_engine.transcription.input.windows import Window
from seq2seq_engine.transcription.options import resolve_options
from seq2seq_engine.transcription.prompts import whisper_tokens_for
from seq2seq_engine.transcription.schedule.input_source import InputFailed, InputState
from seq2seq_engine.transcription.schedule.window_decoder import WindowDecoder
from seq2seq_engine.transcription.schedule.window_machine import Phase, WindowMachine, align_words
from seq2seq_engine.transcription.timing.word_timestamps import WordAligner

pytestmark = pytest.mark.usefixtures("one_thread", "no_leaked_blocks")

# The clip's first attempt fails (its average log probability is below -0.01) and its attempt at 0.5 is kept.
FORCED_FALLBACK = dict(temperature=(0.0, 0.5), best_of=2, log_prob_threshold=-0.01, no_speech_threshold=None)
_ids = itertools.count()


def _clip(name="en/quick_brown_fox.wav"):
    return load_audio(os.path.join(require_speech_clips(), name))


def _decoder(llm, **options):
    engine = llm.llm_engine
    return WindowDecoder(engine, whisper_tokens_for(engine), resolve_options(None, dict(use_tqdm=False, **options)))


def _state(samples, language="en"):
    return InputState(0, samples, "clip", len(samples), language=language)


def _window(samples, silent=False):
    return Window(0, 0, samples, silent)


def _run(llm, request):
    """The finished RequestOutput of `request`, run alone on the engine."""
    engine = llm.llm_engine
    request_id = f"machine-test-{next(_ids)}"
    engine.add_request(request_id, request.engine_prompt(), request.params)
    while True:
        for output in engine.step():
            if output.request_id == request_id and output.finished:
                return output


def _words(segments):
    return [(w.word, w.start, w.end) for segment in segments for w in segment]


def test_a_failed_attempt_is_retried_at_the_next_temperature_then_kept_and_its_words_aligned(tiny_llm, window_tokens):
    samples = _clip()
    decoder = _decoder(tiny_llm, word_timestamps=True, **FORCED_FALLBACK)
    state, window = _state(samples), _window(samples)
    machine = WindowMachine(decoder, state, window, previous=[])
    assert (machine.phase, machine.attempt, machine.retrying) == (Phase.ATTEMPT, 0, False)
    first = machine.next_request()
    assert first.params.temperature == 0.0 and first.prompt_token_ids == decoder.prompt(state, window, []).token_ids
    machine.on_output(_run(tiny_llm, first))
    assert (machine.phase, machine.attempt, machine.retrying) == (Phase.ATTEMPT, 1, True)
    assert machine.result.temperature == 0.0 and machine.result.avg_logprob < -0.01 and machine.tokens is None
    second = machine.next_request()
    assert (second.params.temperature, second.params.n) == (0.5, 2)
    machine.on_output(_run(tiny_llm, second))
    assert machine.phase is Phase.WORDS and machine.next_request() is None and machine.tokens.words is None
    to_align = machine.alignment()
    assert list(to_align.token_ids) == machine.tokens.token_ids and to_align.language == "en"
    align_words([machine])
    assert machine.done and machine.tokens.temperature == 0.5 and machine.tokens.show_words
    assert machine.tokens.words and machine.next_request() is None
    with pytest.raises(RuntimeError):
        machine.on_output(None)
    # transcribe keeps the same tokens and words for the clip
    (result,) = tiny_llm.transcribe(samples, use_tqdm=False, word_timestamps=True, **FORCED_FALLBACK)
    assert window_tokens == [[machine.tokens.token_ids]]
    assert _words(segment.words for segment in result.segments) == _words(machine.tokens.words)


@pytest.fixture(scope="module")
def base_llm():
    from seq2seq_engine import LLM
    return LLM(require_model("whisper-base"), kv_cache_space_gb=0.3, swap_space_gb=0.01)


def test_detection_sets_the_input_language_then_attempt_0_decodes_the_window(base_llm, window_tokens):
    samples = _clip("es/hola_mundo.wav")
    decoder = _decoder(base_llm, temperature=0.0)
    state, window = _state(samples, language=None), _window(samples)
    machine = WindowMachine(decoder, state, window, previous=[])
    assert machine.phase is Phase.LANGUAGE and machine.prompt is None
    detection = machine.next_request()
    assert detection.prompt_token_ids == decoder.tokens.detection_prompt() and detection.params.max_tokens == 1
    machine.on_output(_run(base_llm, detection))
    assert state.language == "es" and 0 < state.language_probability <= 1
    assert (machine.phase, machine.attempt, machine.retrying) == (Phase.ATTEMPT, 0, False)  # last in line
    attempt = machine.next_request()
    assert decoder.tokens.language_ids["es"] in attempt.prompt_token_ids
    machine.on_output(_run(base_llm, attempt))
    assert machine.done and machine.tokens.temperature == 0.0 and machine.tokens.words is None  # no words wanted
    (result,) = base_llm.transcribe(samples, use_tqdm=False, temperature=0.0)
    assert window_tokens == [[machine.tokens.token_ids]] and result.language == "es"


def test_a_detection_output_naming_no_language_fails_the_input(tiny_llm):
    samples = _clip()
    decoder = _decoder(tiny_llm, temperature=0.0)
    decoded = WindowMachine(decoder, _state(samples), _window(samples), previous=[])
    text_output = _run(tiny_llm, decoded.next_request())  # its first token is text, not a language
    state = _state(samples, language=None)
    machine = WindowMachine(decoder, state, _window(samples), previous=[])
    with pytest.raises(InputFailed) as failure:
        machine.on_output(text_output)
    assert failure.value.state is state and state.language is None and machine.phase is Phase.LANGUAGE


def test_a_silence_verdict_keeps_no_tokens(tiny_llm, window_tokens):
    samples = _clip()
    options = dict(temperature=0.0, no_speech_threshold=0.0, log_prob_threshold=0.0)  # every window is silence
    machine = WindowMachine(_decoder(tiny_llm, **options), _state(samples), _window(samples), previous=[])
    machine.on_output(_run(tiny_llm, machine.next_request()))
    assert machine.done and machine.tokens.token_ids == [] and machine.result.token_ids
    tiny_llm.transcribe(samples, use_tqdm=False, **options)
    assert window_tokens == [[[]]]


def test_a_silent_window_is_final_at_once(tiny_llm):
    samples = np.zeros(16000, dtype=np.float32)
    machine = WindowMachine(_decoder(tiny_llm, word_timestamps=True), _state(samples, language=None),
                            _window(samples, silent=True), previous=[])
    assert machine.done and machine.next_request() is None and machine.result is None
    assert machine.tokens.token_ids == [] and machine.tokens.words == [] and machine.tokens.show_words


def test_a_retry_is_conditioned_on_the_same_previous_text(tiny_llm):
    samples = _clip()
    previous = tiny_llm.llm_engine.tokenizer.encode(" A quick test.", add_special_tokens=False)
    decoder = _decoder(tiny_llm, **FORCED_FALLBACK)
    machine = WindowMachine(decoder, _state(samples), _window(samples), previous=previous)
    first = machine.next_request()
    assert first.prompt_token_ids[:len(previous) + 1] == [decoder.tokens.start_of_prev] + list(previous)
    machine.on_output(_run(tiny_llm, first))
    assert machine.retrying and machine.next_request().prompt_token_ids == first.prompt_token_ids


def test_windows_final_in_the_same_step_are_aligned_in_one_pass(tiny_llm, monkeypatch):
    fox, hello = _clip(), _clip("en/hello_world.wav")
    options = dict(use_tqdm=False, temperature=0.0, word_timestamps=True)
    alone = [tiny_llm.transcribe(clip, **options)[0] for clip in (fox, hello)]
    calls = []
    real = WordAligner.windows_words

    def spy(self, windows):
        calls.append(len(windows))
        return real(self, windows)

    monkeypatch.setattr(WordAligner, "windows_words", spy)
    together = tiny_llm.transcribe([fox, fox, hello], **options)
    assert sum(calls) == 3 and max(calls) >= 2  # the two copies of one clip finish in the same step
    for result, expected in zip(together, [alone[0], alone[0], alone[1]]):
        assert result.text == expected.text
        assert _words(s.words for s in result.segments) == _words(s.words for s in expected.segments)
