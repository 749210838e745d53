"""`seq2seq-engine transcribe` takes faster-whisper's and openai-whisper's flag spellings (--beam_size,
--logprob_threshold, --word_timestamps True, --temperature_increment_on_fallback, ...), and an unrecognized flag is
refused naming the closest valid one (or saying that it is an openai-whisper flag we lack)."""
import pytest

from seq2seq_engine.entrypoints.cli import build_parser, main
from seq2seq_engine.entrypoints.transcribe_flags import fallback_temperatures, options_from_args


def _args(*flags):
    return build_parser().parse_args(["transcribe", "a.wav", *flags])


@pytest.mark.parametrize("flags", [["--beam-width", "2"], ["--beam-size", "2"], ["--beam_size", "2"],
                                   ["--beam_size=2"]])
def test_every_spelling_of_the_beam_width(flags):
    assert _args(*flags).beam_width == 2 and options_from_args(_args(*flags)).beam_width == 2
    assert _args().beam_width is None


@pytest.mark.parametrize("flags, field, value", [
    (["--logprob_threshold", "-0.5"], "log_prob_threshold", -0.5),
    (["--logprob-threshold", "none"], "log_prob_threshold", None),
    (["--best_of", "3"], "best_of", 3), (["--initial_prompt", "Names"], "initial_prompt", "Names"),
    (["--no_speech_threshold", "0.3"], "no_speech_threshold", 0.3),
    (["--compression_ratio_threshold", "2"], "compression_ratio_threshold", 2.0),
    (["--suppress_tokens=-1,220"], "suppress_tokens", (-1, 220)),
    (["--clip_timestamps", "0,1.5"], "clip_timestamps", (0.0, 1.5)),
    (["--hallucination_silence_threshold", "2"], "hallucination_silence_threshold", 2.0),
    (["--condition_on_previous_text", "True"], "condition_on_previous_text", True),
    (["--condition-on-previous-text", "--condition_on_previous_text", "False"], "condition_on_previous_text", False),
    (["--word_timestamps", "True"], "word_timestamps", True),
    (["--output_format", "srt", "--word_timestamps", "false"], "word_timestamps", False),
    (["--temperature_increment_on_fallback", "0.25"], "temperature", (0.0, 0.25, 0.5, 0.75, 1.0)),
    (["--temperature", "0.4", "--temperature-increment-on-fallback", "0.3"], "temperature", (0.4, 0.7, 1.0)),
    (["--temperature", "0.5", "--temperature_increment_on_fallback", "none"], "temperature", (0.5,)),
])
def test_openai_whisper_spellings_set_the_same_options(flags, field, value):
    assert getattr(options_from_args(_args(*flags)), field) == value


def test_output_and_subtitle_spellings():
    args = _args("--output_format", "vtt", "--output_dir", "out", "--max_line_width", "30", "--max_line_count", "1",
                 "--max_words_per_line", "4", "--highlight_words", "True")
    assert (args.output_format, args.output_dir, args.max_line_width, args.max_line_count, args.max_words_per_line,
            args.highlight_words) == ("vtt", "out", 30, 1, 4, True)
    assert (_args().output_format, _args().output_dir, _args().highlight_words) == ("txt", None, None)
    assert _args("--highlight_words", "False").highlight_words is False


@pytest.mark.parametrize("temperature, step, message", [
    ("0,0.5", 0.2, "takes one --temperature"), ("0", 0.0, "must be a number > 0"), ("0", float("nan"), "> 0"),
    ("1.5", 0.2, "from 0 to 1"), ("0", 1e-6, "more than 100"),
])
def test_bad_fallback_steps_are_usage_errors(temperature, step, message):
    with pytest.raises(ValueError, match=message):
        fallback_temperatures(temperature, step)


@pytest.mark.parametrize("argv, message", [
    (["transcribe", "a.wav", "--beam_sise", "2"], "unrecognized arguments: --beam_sise 2; did you mean --beam_size?"),
    (["transcribe", "a.wav", "--beam-sise=2"], "did you mean --beam-size?"),
    (["transcribe", "a.wav", "--tempreture", "0", "--best-off", "2"],
     "--tempreture: did you mean --temperature?; --best-off: did you mean --best-of?"),
    (["transcribe", "a.wav", "--fp16", "False"], "--fp16 (openai-whisper) is not supported here; the engine's dtype"),
    (["transcribe", "a.wav", "--word_timestamps", "maybe"], "expected True or False, got 'maybe'"),
    (["generate", "--model", "m", "--input", "in.txt", "--max-in-flght", "2"], "did you mean --max-in-flight?"),
])
def test_an_unknown_flag_names_the_closest_one(argv, message, capsys):
    with pytest.raises(SystemExit) as caught:
        main(argv)
    err = capsys.readouterr().err
    assert caught.value.code == 2 and message in err, err
    assert err.startswith(f"usage: seq2seq-engine {argv[0]}")
