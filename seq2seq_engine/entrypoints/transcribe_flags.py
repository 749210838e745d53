"""The `seq2seq-engine transcribe` flags that become TranscriptionOptions (decoding, VAD, word timestamps, and
openai-whisper's spellings of them) and the srt/vtt cue flags that become SubtitleOptions."""
from __future__ import annotations

import argparse
import functools
import math
from typing import List, Optional, Tuple

from seq2seq_engine.errors import ParameterError
from seq2seq_engine.transcription.option_aliases import ALIASES
from seq2seq_engine.transcription.options import TranscriptionOptions
from seq2seq_engine.transcription.output.results import OUTPUT_FORMATS
from seq2seq_engine.transcription.output.subtitles import SubtitleOptions

# TranscriptionOptions fields set by the decoding flags, only when given (argparse.SUPPRESS).
_DECODING_FIELDS = ("temperature", "best_of", "compression_ratio_threshold", "log_prob_threshold",
                    "no_speech_threshold", "prompt_reset_on_temperature", "initial_prompt", "prefix", "hotwords",
                    "suppress_tokens", "suppress_blank", "clip_timestamps", "hallucination_silence_threshold", "seed")

# (flag, VadOptions field, type, help)
_VAD_FLAGS = [("--vad-threshold", "threshold", float, "speech probability threshold (default 0.5)"),
              ("--vad-neg-threshold", "neg_threshold", float, "silence threshold inside speech (threshold - 0.15)"),
              ("--vad-min-speech-ms", "min_speech_duration_ms", float, "drop shorter speech (default 0)"),
              ("--vad-max-speech-s", "max_speech_duration_s", float, "cut longer speech (default and at most 30)"),
              ("--vad-min-silence-ms", "min_silence_duration_ms", float, "silence that ends speech (default 160)"),
              ("--vad-speech-pad-ms", "speech_pad_ms", float, "padding on each side of speech (default 400)")]
# (flag, SubtitleOptions field)
_SUBTITLE_FLAGS = (("--max-line-width", "max_line_width"), ("--max-line-count", "max_line_count"),
                   ("--max-words-per-line", "max_words_per_line"), ("--highlight-words", "highlight_words"))
_SUBTITLE_FLAG_OF = {field: flag for flag, field in _SUBTITLE_FLAGS}
SUBTITLE_FORMATS = ("srt", "vtt")
# (timestamps, word_timestamps) of --output-format srt|vtt when neither --[no-]timestamps nor --[no-]word-timestamps
# is given (docs/decisions.md §74): word timings place cues on the speech and keep the txt/json transcript (1.5-2x
# the plain time); timestamp tokens (1.1-1.3x) let cues run into silence and dropped or changed words.
SUBTITLE_TIMING = (False, True)
MAX_FALLBACK_TEMPERATURES = 100   # of --temperature-increment-on-fallback


def _optional_float(text: str) -> Optional[float]:
    return None if text.strip().lower() == "none" else float(text)


def _true_false(text: str) -> bool:
    """openai-whisper's True/False flag values (any case)."""
    lowered = text.strip().lower()
    if lowered not in ("true", "false"):
        raise argparse.ArgumentTypeError(f"expected True or False, got {text!r}")
    return lowered == "true"


def spellings(flag: str, underscored: bool = False) -> List[str]:
    """`flag`; with `underscored`, also with underscores (openai-whisper's spelling of the same option); and, with
    dashes and with underscores, each name openai-whisper's command line gives the option instead (option_aliases.py:
    the aliases with cli=True): spellings("--beam-width") is --beam-width, --beam-size, --beam_size."""
    field = flag[2:].replace("-", "_")
    names = [flag, f"--{field}"] if underscored and f"--{field}" != flag else [flag]
    for alias in ALIASES.values():
        if alias.cli and alias.option == field:
            names += [f"--{alias.name.replace('_', '-')}", f"--{alias.name}"]
    return names


def add_decoding_arguments(parser: argparse.ArgumentParser) -> None:
    """The robustness flags (openai-whisper / faster-whisper semantics); defaults are TranscriptionOptions'."""
    group = parser.add_argument_group("decoding", "defaults as openai-whisper; 'none' disables a threshold")
    add = functools.partial(group.add_argument, default=argparse.SUPPRESS)
    add("--temperature", help="a temperature, or comma-separated ones tried in turn when a window fails "
                              "(default 0,0.2,0.4,0.6,0.8,1.0; 0 alone: greedy/beam search only)")
    add(*spellings("--temperature-increment-on-fallback", True), type=_optional_float, metavar="STEP",
        help="openai-whisper's: try --temperature (one value, default 0), then it plus STEP, ... up to 1.0; 'none': "
             "--temperature alone")
    add(*spellings("--best-of", True), type=int, metavar="N",
        help="samples per window at temperatures above 0 (default 5)")
    add(*spellings("--compression-ratio-threshold", True), type=_optional_float, metavar="RATIO",
        help="fail a window whose text's zlib compression ratio is above this (default 2.4)")
    add(*spellings("--log-prob-threshold"), type=_optional_float, metavar="LOGPROB",
        help="fail a window whose average token logprob is below this (default -1.0)")
    add(*spellings("--no-speech-threshold", True), type=_optional_float, metavar="P",
        help="a window with P(no speech) above this and a failing logprob is silence (default 0.6)")
    add("--prompt-reset-on-temperature", type=float, help="with --condition-on-previous-text, forget the text "
                                                          "before a window decoded above this temperature (0.5)")
    add(*spellings("--initial-prompt", True), metavar="TEXT",
        help="text the first window is conditioned on (names, spellings, style)")
    add("--prefix", help="text the first window's transcript starts with")
    add("--hotwords", help="hint phrases put before every window's prompt (not with a prefix)")
    add(*spellings("--suppress-tokens", True), metavar="IDS",
        help="comma-separated token ids never produced; -1: the model's list (default; write --suppress-tokens=-1,220 "
             "when the list starts with -1)")
    add("--no-suppress-blank", dest="suppress_blank", action="store_false",
        help="allow a window to start with a blank or end at once")
    add(*spellings("--clip-timestamps", True), metavar="SECONDS",
        help="start,end,... seconds: transcribe only these spans (a last end may be left out)")
    add(*spellings("--hallucination-silence-threshold", True), type=float, metavar="SECONDS",
        help="drop a segment whose words look hallucinated when silence longer than this surrounds it")
    add("--seed", type=int, help="seed of the sampled attempts (default 0)")
    _add_command_spellings(parser)


def _add_command_spellings(parser: argparse.ArgumentParser) -> None:
    """faster-whisper's / openai-whisper's spellings of the transcribe command's own flags (transcribe_cli.py):
    --beam-size/--beam_size, --condition_on_previous_text True|False, --output_format, --output_dir."""
    group = parser.add_argument_group("other spellings", "faster-whisper's and openai-whisper's names of the flags "
                                                         "above (docs/transcription.md)")
    add = functools.partial(group.add_argument, default=argparse.SUPPRESS)
    add(*spellings("--beam-width")[1:], dest="beam_width", type=int, metavar="N", help="= --beam-width")
    add("--condition_on_previous_text", type=_true_false, metavar="{True,False}",
        help="= --condition-on-previous-text (default False)")
    add("--output_format", choices=list(OUTPUT_FORMATS), help="= --output-format")
    add("--output_dir", metavar="DIR", help="= --output-dir")


def add_word_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("word timestamps")
    group.add_argument("--word-timestamps", action=argparse.BooleanOptionalAction, default=None,
                       help="time each word (json: segments[].words; srt/vtt: cues placed by the words; default: "
                            "on for srt/vtt unless --[no-]timestamps is given, else off)")
    group.add_argument("--word_timestamps", type=_true_false, default=argparse.SUPPRESS, metavar="{True,False}",
                       help="= --word-timestamps / --no-word-timestamps")


def add_subtitle_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("subtitles", "srt/vtt cues (openai-whisper's names): at most 7 s long, never "
                                                   "across a pause over 1 s, lines broken at words")
    group.add_argument(*spellings("--max-line-width", True), type=int, default=None, metavar="N",
                       help="characters per line (42)")
    group.add_argument(*spellings("--max-line-count", True), type=int, default=None, metavar="N",
                       help="lines per cue (2; 1 with --max-words-per-line)")
    group.add_argument(*spellings("--max-words-per-line", True), type=int, default=None, metavar="N",
                       help="words per line (turns on --word-timestamps)")
    group.add_argument("--highlight-words", action="store_true", default=None,
                       help="a cue per word with the word underlined (<u>); turns on --word-timestamps")
    group.add_argument("--highlight_words", type=_true_false, default=argparse.SUPPRESS, metavar="{True,False}",
                       help="= --highlight-words (False: off)")


def subtitle_options(args: argparse.Namespace) -> SubtitleOptions:
    """The cue flags as SubtitleOptions (ValueError naming the flag when a value is out of range)."""
    given = {field: getattr(args, field) for _, field in _SUBTITLE_FLAGS if getattr(args, field, None) is not None}
    try:
        return SubtitleOptions(**given)
    except ParameterError as error:
        if error.param not in given or error.requirement is None:
            raise
        value = given[error.param]
        raise ValueError(f"{_SUBTITLE_FLAG_OF[error.param]} must be {error.requirement}, got {value!r}") from None


def timing_flags(args: argparse.Namespace, subtitles: SubtitleOptions) -> Tuple[bool, bool]:
    """(timestamps, word_timestamps): as given; for srt/vtt with neither given, SUBTITLE_TIMING; word timestamps
    also for the cue flags that need them (--max-words-per-line, --highlight-words)."""
    timestamps, words = getattr(args, "timestamps", None), getattr(args, "word_timestamps", None)
    if words is False and subtitles.highlight_words:
        raise ValueError("--highlight-words needs word timestamps: it cannot be used with --no-word-timestamps")
    defaults = (timestamps is None and words is None and getattr(args, "output_format", None) in SUBTITLE_FORMATS)
    if words is None:
        words = subtitles.max_words_per_line is not None or subtitles.highlight_words or (
            defaults and SUBTITLE_TIMING[1])
    if timestamps is None:
        timestamps = defaults and SUBTITLE_TIMING[0]
    return bool(timestamps), bool(words)


def add_vad_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("voice activity detection", "Silero VAD, faster-whisper's settings")
    group.add_argument("--vad-filter", action=argparse.BooleanOptionalAction, default=None,
                       help="decode only speech found by Silero VAD, packed into 30 s windows (default: on for "
                            "inputs longer than 30 s, off for shorter ones)")
    for flag, field, kind, text in _VAD_FLAGS:
        group.add_argument(flag, dest=f"vad_{field}", type=kind, default=None, metavar=kind.__name__.upper(),
                           help=f"VAD setting: {text}")


def vad_parameters(args: argparse.Namespace) -> dict:
    """The VAD settings given on the command line (VadOptions fields); a setting with --no-vad-filter is an error."""
    given = {field: getattr(args, f"vad_{field}") for _, field, _, _ in _VAD_FLAGS
             if getattr(args, f"vad_{field}", None) is not None}
    if given and args.vad_filter is False:
        flags = [flag for flag, field, _, _ in _VAD_FLAGS if field in given]
        raise ValueError(f"{', '.join(flags)} cannot be used with --no-vad-filter")
    return given


def options_from_args(args: argparse.Namespace) -> TranscriptionOptions:
    """TranscriptionOptions from parsed flags (ValueError naming the option when a value is out of range)."""
    given = {name: getattr(args, name) for name in _DECODING_FIELDS if hasattr(args, name)}
    if hasattr(args, "temperature_increment_on_fallback"):
        given["temperature"] = fallback_temperatures(getattr(args, "temperature", "0"),
                                                     args.temperature_increment_on_fallback)
    timestamps, word_timestamps = timing_flags(args, subtitle_options(args))  # cue flags checked whatever the format
    return TranscriptionOptions(language=args.language, task=args.task, timestamps=timestamps,
                                condition_on_previous_text=args.condition_on_previous_text,
                                max_new_tokens=args.max_new_tokens, beam_width=args.beam_width,
                                skip_silence=args.skip_silence, use_tqdm=not args.quiet,
                                vad_filter=args.vad_filter, vad_parameters=vad_parameters(args),
                                word_timestamps=word_timestamps, **given)


def fallback_temperatures(temperature: str, increment: Optional[float]) -> Tuple[float, ...]:
    """openai-whisper's `--temperature T --temperature_increment_on_fallback STEP`: T, T + STEP, ... up to 1.0
    (T alone when STEP is None); a ValueError for several temperatures, T outside 0..1 or STEP <= 0."""
    flag = "--temperature-increment-on-fallback"
    try:
        start = float(temperature)
    except ValueError:
        raise ValueError(f"{flag} takes one --temperature to start from, got {temperature!r}") from None
    if increment is None:
        return (start,)
    if not (math.isfinite(increment) and increment > 0):
        raise ValueError(f"{flag} must be a number > 0 or none, got {increment}")
    if not 0 <= start <= 1:
        raise ValueError(f"with {flag}, --temperature must be from 0 to 1, got {start}")
    count = int((1.0 + 1e-6 - start) / increment) + 1
    if count > MAX_FALLBACK_TEMPERATURES:
        raise ValueError(f"{flag} {increment} gives {count} temperatures, more than {MAX_FALLBACK_TEMPERATURES}")
    return tuple(round(start + step * increment, 6) for step in range(count))
