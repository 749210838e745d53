"""The `seq2seq-engine transcribe` flags that become TranscriptionOptions: decoding (openai-whisper's robustness
rules), voice activity detection (Silero VAD, faster-whisper's settings) and word timestamps."""
from __future__ import annotations

import argparse
import functools
from typing import Optional

from seq2seq_engine.transcription.options import TranscriptionOptions

# TranscriptionOptions fields set by the decoding flags, only when given (argparse.SUPPRESS).
_DECODING_FIELDS = ("temperature", "best_of", "compression_ratio_threshold", "log_prob_threshold",
                    "no_speech_threshold", "prompt_reset_on_temperature", "initial_prompt", "prefix", "hotwords",
                    "suppress_tokens", "suppress_blank", "clip_timestamps", "hallucination_silence_threshold", "seed")

# (flag, VadOptions field, type, help)
_VAD_FLAGS = [("--vad-threshold", "threshold", float, "speech probability threshold (default 0.5)"),
              ("--vad-neg-threshold", "neg_threshold", float, "silence threshold inside speech (threshold - 0.15)"),
              ("--vad-min-speech-ms", "min_speech_duration_ms", float, "drop shorter speech (default 0)"),
              ("--vad-max-speech-s", "max_speech_duration_s", float, "cut longer speech (default and at most 30)"),
              ("--vad-min-silence-ms", "min_silence_duration_ms", float, "silence that ends speech (default 2000)"),
              ("--vad-speech-pad-ms", "speech_pad_ms", float, "padding on each side of speech (default 400)")]


def _optional_float(text: str) -> Optional[float]:
    return None if text.strip().lower() == "none" else float(text)


def add_decoding_arguments(parser: argparse.ArgumentParser) -> None:
    """The robustness flags (openai-whisper / faster-whisper semantics); defaults are TranscriptionOptions'."""
    group = parser.add_argument_group("decoding", "defaults as openai-whisper; 'none' disables a threshold")
    add = functools.partial(group.add_argument, default=argparse.SUPPRESS)
    add("--temperature", help="a temperature, or comma-separated ones tried in turn when a window fails "
                              "(default 0,0.2,0.4,0.6,0.8,1.0; 0 alone: greedy/beam search only)")
    add("--best-of", type=int, help="samples per window at temperatures above 0 (default 5)")
    add("--compression-ratio-threshold", type=_optional_float, help="fail a window whose text's zlib compression "
                                                                    "ratio is above this (default 2.4)")
    add("--log-prob-threshold", type=_optional_float, help="fail a window whose average token logprob is below "
                                                           "this (default -1.0)")
    add("--no-speech-threshold", type=_optional_float, help="a window with P(no speech) above this and a failing "
                                                            "logprob is silence (default 0.6)")
    add("--prompt-reset-on-temperature", type=float, help="with --condition-on-previous-text, forget the text "
                                                          "before a window decoded above this temperature (0.5)")
    add("--initial-prompt", help="text the first window is conditioned on (names, spellings, style)")
    add("--prefix", help="text the first window's transcript starts with")
    add("--hotwords", help="hint phrases put before every window's prompt (not with a prefix)")
    add("--suppress-tokens", help="comma-separated token ids never produced; -1: the model's list (default; write "
                                  "--suppress-tokens=-1,220 when the list starts with -1)")
    add("--no-suppress-blank", dest="suppress_blank", action="store_false",
        help="allow a window to start with a blank or end at once")
    add("--clip-timestamps", help="start,end,... seconds: transcribe only these spans (a last end may be left out)")
    add("--hallucination-silence-threshold", type=float, metavar="SECONDS",
        help="drop a segment whose words look hallucinated when silence longer than this surrounds it")
    add("--seed", type=int, help="seed of the sampled attempts (default 0)")


def add_word_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("word timestamps")
    group.add_argument("--word-timestamps", action="store_true", help="time each word (json: segments[].words)")
    group.add_argument("--max-words-per-line", type=int, default=None, metavar="N",
                       help="srt/vtt: cues of at most N words (turns on --word-timestamps)")


def max_words_per_line(args: argparse.Namespace) -> Optional[int]:
    """--max-words-per-line, checked (ValueError when below 1)."""
    value = getattr(args, "max_words_per_line", None)
    if value is not None and value < 1:
        raise ValueError(f"--max-words-per-line must be >= 1, got {value}")
    return value


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
    words_per_line = max_words_per_line(args)  # checked even with --word-timestamps given
    word_timestamps = getattr(args, "word_timestamps", False) or words_per_line is not None
    return TranscriptionOptions(language=args.language, task=args.task, timestamps=args.timestamps,
                                condition_on_previous_text=args.condition_on_previous_text,
                                max_new_tokens=args.max_new_tokens, beam_width=args.beam_width,
                                skip_silence=args.skip_silence, use_tqdm=not args.quiet,
                                vad_filter=args.vad_filter, vad_parameters=vad_parameters(args),
                                word_timestamps=word_timestamps, **given)
