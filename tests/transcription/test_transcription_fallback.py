"""Whisper's robustness rules, no model: scores, verdicts vs openai-whisper's rules, options, prompts, CLI flags."""
import argparse
import dataclasses
import io
import itertools
import re
import zlib

import numpy as np
import pytest
import torch
from test_transcription_units import EN, ts

from seq2seq_engine.beam_search_params import BeamSearchParams
from seq2seq_engine.entrypoints import transcribe_cli
from seq2seq_engine.sampling_params import SamplingParams
from seq2seq_engine.transcription import Segment, TranscriptionOptions, WindowTokens, stitch
from seq2seq_engine.transcription.decode.decode_params import DecodePlan, attempt_seed, suppress_ids
from seq2seq_engine.transcription.decode.fallback import (Attempt, Thresholds, Verdict, average_logprob, best_sample,
                                                          compression_ratio, rank_score, verdict)
from seq2seq_engine.transcription.input.window_source import clip_windows
from seq2seq_engine.transcription.options import resolve_options


# ---------------------------------------------------------------------------------------------- scores
def test_compression_ratio_of_known_strings():
    # "hello": 2-byte zlib header, a fixed-Huffman block of 3 header bits + 5 literals x 8 bits + a 7-bit end code
    # (50 bits -> 7 bytes), 4-byte Adler-32: 13 bytes.
    assert compression_ratio("hello") == 5 / 13
    assert compression_ratio("") == 0.0  # 0 bytes over 2 + 2 (an empty fixed block) + 4
    assert compression_ratio("héllo") == 6 / 14  # UTF-8 bytes: é is two
    looping = "I am sorry. " * 20
    assert compression_ratio(looping) == 240 / len(zlib.compress(looping.encode()))
    assert compression_ratio(looping) > 2.4 > compression_ratio("The quick brown fox jumps over the lazy dog.")


def test_average_logprob_and_best_of_ranking_follow_openai_whisper():
    # avg_logprob counts <|endoftext|>: 5 tokens before it, logprobs summing to -3 -> -3 / 6.
    assert average_logprob(-3.0, 5) == -0.5
    assert rank_score(-2.0, 4) == -0.5 and rank_score(-1.0, 0) == -1.0
    # MaximumLikelihoodRanker divides by length: the longer sample wins though its sum is lower.
    long, short = ([1, 2, 3, 4], -2.0), ([1], -1.0)
    assert best_sample([short, long]) == long
    assert best_sample([([5, 6], -1.0), ([7, 8], -1.0)]) == ([5, 6], -1.0)  # the first of equals


def _openai_rules(cr, lp, nsp, cr_threshold, lp_threshold, ns_threshold):
    """openai-whisper transcribe.py, written out: (needs_fallback, should_skip) for one decode result."""
    needs_fallback = False
    if cr_threshold is not None and cr > cr_threshold:
        needs_fallback = True
    if lp_threshold is not None and lp < lp_threshold:
        needs_fallback = True
    if ns_threshold is not None and nsp > ns_threshold and lp_threshold is not None and lp < lp_threshold:
        needs_fallback = False
    should_skip = False
    if ns_threshold is not None:
        should_skip = nsp > ns_threshold
        if lp_threshold is not None and lp > lp_threshold:
            should_skip = False
    return needs_fallback, should_skip


def test_verdicts_equal_openai_whisper_rules_on_a_grid():
    grid = itertools.product([0.5, 2.4, 2.41, 9.0], [-3.0, -1.0, -0.999, -0.1], [0.0, 0.6, 0.61, 0.99],
                             [2.4, None], [-1.0, None], [0.6, None], [True, False])
    for cr, lp, nsp, cr_t, lp_t, ns_t, has_next in grid:
        attempt = Attempt([1], "x", 0.0, lp, cr, nsp)
        needs_fallback, should_skip = _openai_rules(cr, lp, nsp, cr_t, lp_t, ns_t)
        expected = (Verdict.RETRY if has_next and needs_fallback else
                    Verdict.SILENCE if should_skip else Verdict.ACCEPT)
        assert verdict(attempt, Thresholds(cr_t, lp_t, ns_t), has_next) is expected, (cr, lp, nsp, cr_t, lp_t, ns_t)


@pytest.mark.parametrize("cr, lp, nsp, has_next, expected", [
    (2.5, -0.2, 0.01, True, Verdict.RETRY),      # a repetition loop
    (1.1, -1.5, 0.01, True, Verdict.RETRY),      # unlikely tokens
    (1.1, -1.5, 0.90, True, Verdict.SILENCE),    # unlikely tokens and likely no speech: silence, no retry
    (1.1, -0.3, 0.90, True, Verdict.ACCEPT),     # likely no speech, but confident tokens: kept
    (2.5, -0.2, 0.01, False, Verdict.ACCEPT),    # the last temperature's attempt is kept whatever it scores
    (2.5, -1.5, 0.90, False, Verdict.SILENCE),
    (1.1, -1.0, 0.90, True, Verdict.SILENCE),    # avg == threshold: not a failure, but not "above" it either
])
def test_fallback_decisions_by_hand(cr, lp, nsp, has_next, expected):
    assert verdict(Attempt([1], "x", 0.2, lp, cr, nsp), Thresholds(), has_next) is expected


@pytest.mark.parametrize("seconds, nsp, expected", [
    (0.2, 0.88, Verdict.SILENCE),    # a scrap of audio, likely no speech: no text, however confident its tokens
    (0.99, 0.61, Verdict.SILENCE),
    (0.2, 0.6, Verdict.ACCEPT),      # not above the threshold: kept
    (1.0, 0.88, Verdict.ACCEPT),     # a second or more: openai-whisper's rule (confident tokens keep the window)
    (None, 0.88, Verdict.ACCEPT),    # duration not known: openai-whisper's rule
])
def test_a_window_under_a_second_is_skipped_on_the_no_speech_test_alone(seconds, nsp, expected):
    attempt = Attempt([1], "Thank you.", 0.0, -0.3, 1.1, nsp, audio_seconds=seconds)
    assert verdict(attempt, Thresholds(), True) is expected
    assert verdict(attempt, Thresholds(no_speech=None), True) is Verdict.ACCEPT    # the rule off: always kept


def test_no_measured_no_speech_prob_never_makes_silence():
    assert verdict(Attempt([1], "x", 0.0, -5.0, 1.0, None), Thresholds(), False) is Verdict.ACCEPT


# ---------------------------------------------------------------------------------------------- options
def test_options_defaults_and_normalisation():
    options = TranscriptionOptions()
    assert options.temperatures == (0.0, 0.2, 0.4, 0.6, 0.8, 1.0) and options.best_of == 5
    assert (options.compression_ratio_threshold, options.log_prob_threshold, options.no_speech_threshold,
            options.prompt_reset_on_temperature, options.suppress_tokens) == (2.4, -1.0, 0.6, 0.5, (-1,))
    assert TranscriptionOptions(temperature=0).temperature == (0.0,)
    assert TranscriptionOptions(temperature="0, 0.5,1").temperature == (0.0, 0.5, 1.0)
    assert TranscriptionOptions(temperature=[0.0, 0.4]).temperature == (0.0, 0.4)
    assert TranscriptionOptions(suppress_tokens="-1,220").suppress_tokens == (-1, 220)
    assert TranscriptionOptions(suppress_tokens=None).suppress_tokens == ()
    assert TranscriptionOptions(clip_timestamps="1.5,3").clip_timestamps == (1.5, 3.0)
    assert TranscriptionOptions(initial_prompt=[5, 6]).initial_prompt == (5, 6)
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.temperature = 0.0
    resolved = resolve_options(None, {"temperature": 0.0, "language": "en"})
    assert resolved == TranscriptionOptions(temperature=0.0, language="en")
    assert resolve_options(options, {}) is options
    with pytest.raises(TypeError, match="unknown transcription option 'beam_sise'; did you mean 'beam_size'"):
        resolve_options(None, {"beam_sise": 5})
    assert resolve_options(None, {"beam_size": 5}) == TranscriptionOptions(beam_width=5)   # faster-whisper's name


@pytest.mark.parametrize("field, value, message", [
    ("temperature", -0.1, "temperature must be one or more numbers >= 0"),
    ("temperature", (), "temperature must be one or more numbers >= 0"),
    ("temperature", "hot", "temperature must be numbers separated by commas"),
    ("temperature", float("nan"), "temperature must be a number or a sequence of finite numbers"),
    ("best_of", 0, "best_of must be an int >= 1"),
    ("beam_width", 2.5, "beam_width must be None (the default: 5) or an int >= 1"),
    ("beam_width", 0, "beam_width must be None (the default: 5) or an int >= 1"),
    ("compression_ratio_threshold", 0, "compression_ratio_threshold must be None or a number > 0"),
    ("log_prob_threshold", 0.5, "log_prob_threshold must be None or a number <= 0"),
    ("no_speech_threshold", 1.5, "no_speech_threshold must be None or a number from 0 to 1"),
    ("prompt_reset_on_temperature", -1, "prompt_reset_on_temperature must be a number >= 0"),
    ("suppress_tokens", [-2], "suppress_tokens must be a sequence of int token ids >= -1"),
    ("clip_timestamps", "5,2", "clip_timestamps must be seconds >= 0 in increasing order"),
    ("clip_timestamps", [-1.0], "clip_timestamps must be seconds >= 0"),
    ("initial_prompt", "  ", "initial_prompt must be None, non-blank text or token ids"),
    ("initial_prompt", [1, -1], "initial_prompt must be a sequence of int token ids >= 0"),
    ("prefix", 3, "prefix must be None or non-blank text"),
    ("task", "summarize", "task must be one of"),
    ("max_new_tokens", 0, "max_new_tokens must be None or an int >= 1"),
    ("timestamps", "yes", "timestamps must be True or False"),
    ("seed", -1, "seed must be an int >= 0"),
    ("hallucination_silence_threshold", 0, "hallucination_silence_threshold must be None or a number of seconds > 0"),
    ("hallucination_silence_threshold", "2", "hallucination_silence_threshold must be None or a number of seconds"),
])
def test_options_errors_name_the_field_and_the_limit(field, value, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        TranscriptionOptions(**{field: value})


# ---------------------------------------------------------------------------------------------- windows, prompts
def test_clip_windows_cover_only_the_clips():
    audio = np.arange(70 * 16000, dtype=np.float32)
    spans = [(start, len(chunk)) for start, chunk in clip_windows(audio, (5.0, 40.0), 30 * 16000)]
    assert spans == [(5 * 16000, 30 * 16000), (35 * 16000, 5 * 16000)]
    assert [(s, len(c)) for s, c in clip_windows(audio, (60.0,), 30 * 16000)] == [(60 * 16000, 10 * 16000)]
    whole = [(s, len(c)) for s, c in clip_windows(audio, (), 30 * 16000)]
    assert whole == [(0, 480000), (480000, 480000), (960000, 160000)]
    # 10 ms frames (openai-whisper's seek points), clips past the end cut or dropped
    assert [(s, len(c)) for s, c in clip_windows(audio, (1.2345, 2.0, 69.0, 90.0, 95.0), 30 * 16000)] == [
        (19680, 32000 - 19680), (69 * 16000, 16000)]
    first = clip_windows(audio, (0.5, 1.0), 30 * 16000)[0][1]
    assert np.array_equal(first, audio[8000:16000])


def test_prompt_layout_with_prefix_previous_text_and_timestamps():
    assert EN.prompt(prefix_tokens=[10, 11]) == [EN.sot, EN.no_timestamps, 10, 11]
    assert EN.prompt(timestamps=True, prefix_tokens=[10, 11]) == [EN.sot, ts(0.0), 10, 11]
    assert EN.prompt(previous_tokens=[7, 8], prefix_tokens=[10]) == [EN.start_of_prev, 7, 8, EN.sot,
                                                                     EN.no_timestamps, 10]


EN_FULL = dataclasses.replace(EN, start_of_lm=50359, no_speech=50361)  # tiny.en's <|startoflm|>, <|nocaptions|>


class _Tokenizer:
    """Encodes each word as one id (1000 + its index in a fixed list) after checking openai's leading space."""

    words = ["Hello", "there", "Kubernetes", "kubectl", "Anna"]

    def encode(self, text, add_special_tokens=True):
        assert text.startswith(" ") and not add_special_tokens
        return [1000 + self.words.index(w) for w in text.split()]


def _plan(**overrides):
    engine = argparse.Namespace(tokenizer=_Tokenizer(), max_beam_width=16, max_num_seqs=64)
    return DecodePlan(engine, EN_FULL, resolve_options(None, overrides))


def test_window_prompts_with_initial_prompt_hotwords_and_prefix():
    plan = _plan(initial_prompt="Hello there", prefix="Anna", hotwords="Kubernetes kubectl")
    assert plan.initial_tokens == [1000, 1001] and plan.prefix_tokens == [1004] and plan.hotword_tokens == [1002, 1003]
    first = plan.prompt(None, True, plan.initial_tokens)  # a window with a prefix gets no hotwords
    assert first.token_ids == [EN.start_of_prev, 1000, 1001, EN.sot, EN.no_timestamps, 1004]
    assert first.forced == [1004]
    later = plan.prompt(None, False, [42, 43])  # faster-whisper: hotwords, then the previous text
    assert later.token_ids == [EN.start_of_prev, 1002, 1003, 42, 43, EN.sot, EN.no_timestamps] and not later.forced
    long = plan.prompt(None, False, list(range(300)))  # hotwords and previous text share the 223 context tokens
    assert long.token_ids[:4] == [EN.start_of_prev, 1002, 1003, 79] and len(long.token_ids) == 1 + 223 + 2
    stamped = _plan(prefix="Anna", timestamps=True).prompt(None, True, [])
    assert stamped.token_ids == [EN.sot, ts(0.0), 1004] and stamped.forced == [ts(0.0), 1004]


def test_prefix_processors_see_the_prefix_as_history():
    plan = _plan(prefix="Anna", timestamps=True)
    logits = torch.zeros(EN.vocab_size)
    logits[500] = 20.0  # a text token, far more likely than all timestamps together
    plain = logits.clone()
    for processor in plan.processors:
        plain = processor([], plain)
    after_prefix = logits.clone()
    for processor in plan.prefix_processors:
        after_prefix = processor([], after_prefix)
    assert plain[500] == float("-inf")  # a window's first token must be a timestamp...
    assert after_prefix[500] == 20.0    # ...but after "<|0.00|> Anna" text may go on


def test_suppress_list_follows_openai_whisper():
    specials = {EN.transcribe, EN.translate, EN.sot, EN.start_of_prev}
    assert set(suppress_ids((-1,), EN)) == set(EN.suppress_tokens) | specials
    assert set(suppress_ids((220, 5), EN)) == {220, 5} | specials
    assert set(suppress_ids((), EN)) == specials
    with pytest.raises(ValueError, match="suppress_tokens must be ids below the vocabulary size 51864"):
        suppress_ids((60000,), EN)
    assert [type(p).__name__ for p in _plan(suppress_blank=False).processors] == ["SuppressTokens"]


def test_attempt_parameters_per_temperature():
    plan = _plan(beam_width=3, best_of=4, max_new_tokens=50)
    prompt = plan.prompt(None, False, [7])
    beam, probe = plan.params(prompt, 0.0, seed=11)
    assert isinstance(beam, BeamSearchParams) and beam.beam_width == 3 and beam.max_tokens == 50
    assert beam.prompt_logits_hooks == [(prompt.token_ids.index(EN.sot), probe)] and probe.token_id == 50361
    sampled, _ = plan.params(prompt, 0.6, seed=11)
    assert isinstance(sampled, SamplingParams)
    assert (sampled.n, sampled.best_of, sampled.temperature, sampled.seed) == (4, 4, 0.6, 11)
    odd = _plan(initial_prompt=[EN.sot, 5]).prompt(None, True, [EN.sot, 5])  # the probe reads the real one
    assert plan.params(odd, 0.0, seed=1)[0].prompt_logits_hooks[0][0] == 3 == odd.token_ids.index(EN.sot, 2)
    greedy, _ = _plan(beam_width=1).params(prompt, 0.0, seed=11)
    assert isinstance(greedy, SamplingParams) and greedy.temperature == 0.0 and greedy.n == 1
    default, _ = _plan().params(prompt, 0.0, seed=11)   # faster-whisper's beam_size=5
    assert isinstance(default, BeamSearchParams) and default.beam_width == 5
    with pytest.raises(ValueError, match="best_of must be at most the engine's max_num_seqs"):
        _plan(best_of=65)
    _plan(best_of=65, temperature=0.0)  # no sampled attempt: best_of is unused
    with pytest.raises(ValueError, match="beam_width must be at most the engine's max_beam_width"):
        _plan(beam_width=17)
    few = argparse.Namespace(tokenizer=_Tokenizer(), max_beam_width=3, max_num_seqs=3)
    capped = DecodePlan(few, EN_FULL, TranscriptionOptions(best_of=3))   # the default fits a small engine
    assert capped.options.beam_width == 3 and capped.params(prompt, 0.0, seed=1)[0].beam_width == 3
    with pytest.raises(ValueError, match="beam_width must be at most the engine's max_beam_width"):
        DecodePlan(few, EN_FULL, TranscriptionOptions(beam_width=5, best_of=3))   # a given width is not capped


def test_attempt_seeds_are_fixed_and_distinct():
    seeds = {attempt_seed(0, i, w, a) for i in range(3) for w in range(3) for a in range(3)}
    assert len(seeds) == 27 and all(0 <= s < 2 ** 63 for s in seeds)
    assert attempt_seed(7, 1, 2, 3) == attempt_seed(7, 1, 2, 3) != attempt_seed(8, 1, 2, 3)


# ---------------------------------------------------------------------------------------------- results, CLI
def test_segments_carry_their_window_scores():
    window = WindowTokens(30.0, 5.0, [ts(0.0), 10, ts(1.0)], temperature=0.4, avg_logprob=-0.3,
                          compression_ratio=1.2, no_speech_prob=0.01)
    _, segments = stitch([window], EN, lambda ids: " hi", timestamps=True)
    assert segments == [Segment(30.0, 31.0, "hi")]
    assert segments[0].to_dict() == {"start": 30.0, "end": 31.0, "text": "hi", "temperature": 0.4,
                                     "avg_logprob": -0.3, "compression_ratio": 1.2, "no_speech_prob": 0.01}


def test_cli_flags_become_transcription_options():
    parser = transcribe_cli.configure_parser(argparse.ArgumentParser())
    options = transcribe_cli.options_from_args(parser.parse_args(["a.wav", "--quiet"]))
    assert options == TranscriptionOptions(use_tqdm=False)
    args = parser.parse_args(["a.wav", "--temperature", "0,0.5", "--best-of", "3", "--log-prob-threshold", "none",
                              "--no-speech-threshold", "0.8", "--compression-ratio-threshold", "2.0",
                              "--initial-prompt", "Names: Anna.", "--prefix", "So", "--hotwords", "Anna",
                              "--suppress-tokens=-1,220", "--no-suppress-blank", "--clip-timestamps", "1,5",
                              "--seed", "9", "--prompt-reset-on-temperature", "0.3", "--language", "en"])
    options = transcribe_cli.options_from_args(args)
    assert (options.temperature, options.best_of, options.log_prob_threshold, options.no_speech_threshold,
            options.compression_ratio_threshold) == ((0.0, 0.5), 3, None, 0.8, 2.0)
    assert (options.initial_prompt, options.prefix, options.hotwords, options.suppress_tokens, options.suppress_blank,
            options.clip_timestamps, options.seed, options.prompt_reset_on_temperature, options.language) == (
        "Names: Anna.", "So", "Anna", (-1, 220), False, (1.0, 5.0), 9, 0.3, "en")
    err = io.StringIO()  # a bad value is a usage error naming the option, before any model is loaded
    assert transcribe_cli.run(parser.parse_args(["a.wav", "--temperature", "-1", "--model", "/nonexistent"]),
                              io.StringIO(), err) == 2
    assert "temperature must be one or more numbers >= 0" in err.getvalue()
