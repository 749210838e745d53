"""faster-whisper's and openai-whisper's names of TranscriptionOptions fields, their options we lack, suggestions."""
from __future__ import annotations

import dataclasses
import difflib
from typing import Any, Dict, Iterable, Mapping, Optional, Tuple

from seq2seq_engine.errors import ParameterError, ParameterTypeError

FASTER, OPENAI, BOTH = "faster-whisper", "openai-whisper", "faster-whisper, openai-whisper"


@dataclasses.dataclass(frozen=True)
class Alias:
    """`name`: another tool's name of the TranscriptionOptions field `option`, with the same meaning; `inverted`: a
    True/False meaning the opposite (`without_timestamps=True` is `timestamps=False`); `used_by`: the tools that
    spell it so; `cli`: openai-whisper's command line has it as `--<name>` (the transcribe command takes it spelt
    with underscores and with dashes)."""

    name: str
    option: str
    used_by: str
    cli: bool = False
    inverted: bool = False


ALIASES: Dict[str, Alias] = {alias.name: alias for alias in (
    Alias("beam_size", "beam_width", BOTH, cli=True),
    Alias("logprob_threshold", "log_prob_threshold", OPENAI, cli=True),
    Alias("sample_len", "max_new_tokens", OPENAI),
    Alias("log_progress", "use_tqdm", FASTER),
    Alias("without_timestamps", "timestamps", BOTH, inverted=True),
)}

# Their options with no counterpart here: name -> (the tools that have it, what to use instead; "" when nothing).
# A name of openai-whisper's command line is its `--<name>` flag too.
UNSUPPORTED: Dict[str, Tuple[str, str]] = {
    "patience": (BOTH, ""),
    "length_penalty": (BOTH, "beam hypotheses are ranked by sum of logprobs / length, the default of both"),
    "repetition_penalty": (FASTER, ""),
    "no_repeat_ngram_size": (FASTER, ""),
    "max_initial_timestamp": (BOTH, "the model's generation_config.json sets it (1.0 s when it does not)"),
    "prepend_punctuations": (BOTH, ""),
    "append_punctuations": (BOTH, ""),
    "multilingual": (FASTER, "the language is detected once per input"),
    "chunk_length": (FASTER, "windows are 30 s"),
    "language_detection_threshold": (FASTER, ""),
    "language_detection_segments": (FASTER, ""),
    "batch_size": ("faster-whisper's BatchedInferencePipeline",
                   "windows are batched by the engine; max_in_flight bounds its requests at once"),
    "carry_initial_prompt": (OPENAI, ""),
    "verbose": (OPENAI, "the command line's --quiet turns the progress bar off"),
    "fp16": (OPENAI, "the engine's dtype sets the precision (--dtype, LLM(dtype=...))"),
    "threads": (OPENAI, "torch's threads follow OMP_NUM_THREADS"),
    "model_dir": (OPENAI, "converted models are kept under $SEQ2SEQ_ENGINE_CACHE"),
}


# Their options at the value that means what this engine does (their defaults, mostly): accepted and dropped, so a
# call written for them with its defaults spelt out runs here; any other value is refused as UNSUPPORTED.
NEUTRAL: Dict[str, Tuple[Any, ...]] = {
    "patience": (None, 1.0),               # beam search keeps beam_width finished hypotheses
    "length_penalty": (None, 1.0),         # ranked by sum of logprobs / length
    "repetition_penalty": (1.0,),
    "no_repeat_ngram_size": (0,),
    "multilingual": (False,),              # the language is detected once per input
    "chunk_length": (None, 30),            # 30 s windows
    "language_detection_segments": (1,),   # detection on the first window
    "carry_initial_prompt": (False,),
}


def is_neutral(name: str, value: Any) -> bool:
    """Whether `name` is another tool's option we lack, given at a value that changes nothing here (NEUTRAL)."""
    return any(not _differ(value, neutral) for neutral in NEUTRAL.get(name, ()))


def option_name(name: str) -> str:
    """The TranscriptionOptions field `name` stands for: its field when it is an alias, else `name` itself."""
    alias = ALIASES.get(name)
    return alias.option if alias is not None else name


def closest(name: str, candidates: Iterable[str]) -> Optional[str]:
    """The candidate most like `name` (difflib), or None when none is close."""
    matches = difflib.get_close_matches(name, sorted(set(candidates)), n=1)
    return matches[0] if matches else None


def unsupported_note(name: str, spelled: str, hint: bool = True) -> Optional[str]:
    """"<spelled> (<tools>) is not supported here[; what to use instead, with `hint`]" when `name` (underscores) is
    one of UNSUPPORTED, else None."""
    if name not in UNSUPPORTED:
        return None
    used_by, instead = UNSUPPORTED[name]
    accepted = " or ".join(repr(value) for value in NEUTRAL.get(name, ()))
    accepted = f" (only at {accepted}, what this engine does)" if accepted else ""
    return f"{spelled} ({used_by}) is not supported here{accepted}" + (f"; {instead}" if instead and hint else "")


def unknown_message(name: str, candidates: Iterable[str], kind: str = "transcription option",
                    hint: bool = True) -> str:
    """Why `name` is refused: another tool's option we lack (UNSUPPORTED), else an unknown name with the closest
    candidate suggested ("unknown transcription option 'beam_sise'; did you mean 'beam_size'?") or, when none is
    close, the candidates listed."""
    candidates = sorted(set(candidates))
    note = unsupported_note(name, f"{kind} {name!r}", hint)
    if note is not None:
        return note
    match = closest(name, candidates)
    if match is not None:
        return f"unknown {kind} {name!r}; did you mean {match!r}?"
    return f"unknown {kind} {name!r}; known: {', '.join(candidates)}"


def resolve_aliases(given: Mapping[str, Any], fields: Iterable[str]) -> Dict[str, Any]:
    """`given` (keyword options) with every alias replaced by its field (an inverted one's value negated) and the
    NEUTRAL settings dropped. An unknown name is a ParameterTypeError naming the closest valid one; an alias and its
    field (or two names of one field) with different values a ParameterError naming both."""
    fields = set(fields)
    resolved: Dict[str, Any] = {}
    spelled: Dict[str, str] = {}
    for name, value in given.items():
        alias = ALIASES.get(name)
        if alias is None and name not in fields:
            if is_neutral(name, value):
                continue
            raise ParameterTypeError(unknown_message(name, fields | set(ALIASES)), name)
        option = name if alias is None else alias.option
        if alias is not None and alias.inverted:
            value = _negated(name, value)
        if option in resolved and _differ(resolved[option], value):
            first = spelled[option]
            raise ParameterError(f"{first}={given[first]!r} and {name}={given[name]!r} set the same option "
                                 f"({_meaning(first, name, option)}); give one of them", name)
        resolved[option] = value
        spelled.setdefault(option, name)
    return resolved


def _negated(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ParameterTypeError(f"{name} must be True or False, got {value!r}", name, "True or False")
    return not value


def _differ(a: Any, b: Any) -> bool:
    return type(a) is not type(b) and not (_numeric(a) and _numeric(b)) or a != b


def _numeric(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _meaning(first: str, second: str, option: str) -> str:
    inverted = [name for name in (first, second) if name in ALIASES and ALIASES[name].inverted]
    return f"{option} = not {inverted[0]}" if inverted else option
