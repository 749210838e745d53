"""TranscriptionOptions: every setting of a `transcribe` call as one validated, frozen dataclass."""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Dict, Optional, Sequence, Tuple, Union

from seq2seq_engine.audio.vad import VadOptions
from seq2seq_engine.errors import ParameterError
from seq2seq_engine.lora_request import LoRARequest
from seq2seq_engine.transcription.option_aliases import resolve_aliases
from seq2seq_engine.transcription.prompts import TASKS

# openai-whisper's and faster-whisper's default fallback temperatures.
DEFAULT_TEMPERATURES = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)
DEFAULT_BEAM_WIDTH = 5   # faster-whisper's beam_size and openai-whisper's command line (decisions §90)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _fail(name: str, limit: str, value: Any) -> None:
    raise ParameterError(f"{name} must be {limit}, got {value!r}", name, limit)


def _floats(name: str, value: Any) -> Tuple[float, ...]:
    """A float, a sequence of them, or a comma-separated string ("0,0.2,0.4") as a tuple of floats."""
    if isinstance(value, str):
        try:
            value = [float(part) for part in value.split(",") if part.strip()]
        except ValueError:
            _fail(name, "numbers separated by commas", value)
    if _number(value):
        return (float(value),)
    if not isinstance(value, (list, tuple)) or not all(_number(v) for v in value):
        _fail(name, "a number or a sequence of finite numbers", value)
    return tuple(float(v) for v in value)


def _token_ids(name: str, value: Any, minimum: int) -> Tuple[int, ...]:
    if isinstance(value, str):
        try:
            value = [int(part) for part in value.split(",") if part.strip()]
        except ValueError:
            _fail(name, "token ids separated by commas", value)
    if value is None:
        return ()
    if not isinstance(value, (list, tuple)) or not all(_integer(t) and t >= minimum for t in value):
        _fail(name, f"a sequence of int token ids >= {minimum}", value)
    return tuple(value)


@dataclasses.dataclass(frozen=True)
class TranscriptionOptions:
    """How `transcribe` decodes; openai-whisper's / faster-whisper's names and defaults where they have one.

    Windows and prompts: `language` (None: detect per input), `task`, `timestamps`, `condition_on_previous_text`
    (decode an input's windows in order, each prompted with the text before it), `initial_prompt` (text or token
    ids before the first window), `prefix` (text the first window starts with), `hotwords` (text put before every
    window's prompt, unless the window has a prefix), `clip_timestamps` ("start,end,..." seconds: only those spans),
    `skip_silence` (windows below -60 dBFS are not decoded), `max_new_tokens` per window (None: 224), `vad_filter`
    (decode only the speech Silero VAD finds, packed into 30 s windows, timestamps mapped back to the input; None,
    the default: on for an input longer than one 30 s window or of unknown length, off for shorter ones) with
    `vad_parameters` (a VadOptions or a dict of its fields; stored as a VadOptions, checked even with VAD off).
    Decoding: `temperature` (a float or a sequence tried in order when a window fails: docs/transcription.md),
    `best_of` (samples per attempt at temperature > 0, the most likely by average logprob kept), `beam_width`
    (beam search at temperature 0; 1: greedy; None, the default: 5 as in faster-whisper, or the engine's
    max_beam_width when that is lower), `compression_ratio_threshold`, `log_prob_threshold`,
    `no_speech_threshold` (None disables each rule), `prompt_reset_on_temperature`, `suppress_blank`,
    `suppress_tokens` (-1: the model's list), `seed` (of the sampled attempts).
    Words: `word_timestamps` (each segment gets `.words`, timed by an alignment pass over each window's kept
    tokens: word_timestamps.py).
    Running: `use_tqdm`, `max_in_flight` (most engine requests at once; None: the engine's max_num_seqs),
    `max_audio_seconds` (None: no limit; an input whose audio lasts longer fails, decoded no further than that),
    `lora_request` (a LoRARequest: every request of the call, its alignment pass included, runs with that adapter).
    `hallucination_silence_threshold` (seconds; openai-whisper's rule: a segment whose words look hallucinated,
    with silence longer than this on both sides, is dropped; it times the words even without word_timestamps:
    hallucination.py).
    `from_kwargs` also takes faster-whisper's and openai-whisper's names of the fields (option_aliases.py).
    """

    language: Optional[str] = None
    task: str = "transcribe"
    timestamps: bool = False
    condition_on_previous_text: bool = False
    max_new_tokens: Optional[int] = None
    skip_silence: bool = True
    beam_width: Optional[int] = None
    temperature: Union[float, Tuple[float, ...]] = DEFAULT_TEMPERATURES
    best_of: int = 5
    compression_ratio_threshold: Optional[float] = 2.4
    log_prob_threshold: Optional[float] = -1.0
    no_speech_threshold: Optional[float] = 0.6
    prompt_reset_on_temperature: float = 0.5
    initial_prompt: Optional[Union[str, Tuple[int, ...]]] = None
    prefix: Optional[str] = None
    hotwords: Optional[str] = None
    suppress_blank: bool = True
    suppress_tokens: Optional[Tuple[int, ...]] = (-1,)
    clip_timestamps: Union[str, Tuple[float, ...]] = ()
    vad_filter: Optional[bool] = None
    vad_parameters: Optional[Union[VadOptions, Dict[str, Any]]] = None
    word_timestamps: bool = False
    hallucination_silence_threshold: Optional[float] = None
    seed: int = 0
    use_tqdm: bool = True
    max_in_flight: Optional[int] = None
    max_audio_seconds: Optional[float] = None
    lora_request: Optional[LoRARequest] = None

    def __post_init__(self) -> None:
        self._set("temperature", _floats("temperature", self.temperature))
        self._set("suppress_tokens", _token_ids("suppress_tokens", self.suppress_tokens, -1))
        self._set("clip_timestamps", _floats("clip_timestamps", self.clip_timestamps))
        self._set("vad_parameters", VadOptions.from_parameters(self.vad_parameters))  # a typo is an error
        if self.initial_prompt is not None and not isinstance(self.initial_prompt, str):
            self._set("initial_prompt", _token_ids("initial_prompt", self.initial_prompt, 0))
        if self.lora_request is not None and not isinstance(self.lora_request, LoRARequest):
            _fail("lora_request", "None or a LoRARequest", self.lora_request)
        self._check_switches()
        self._check_decoding()
        self._check_thresholds()
        self._check_text()

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> "TranscriptionOptions":
        """The options of keyword arguments named as the fields or as faster-whisper / openai-whisper name them
        (`beam_size=5`, `logprob_threshold=-1.0`, `without_timestamps=False`; option_aliases.py)."""
        return resolve_options(None, kwargs)

    @property
    def temperatures(self) -> Tuple[float, ...]:
        return self.temperature  # a tuple once validated

    def _set(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)

    def _check_switches(self) -> None:
        for name in ("timestamps", "condition_on_previous_text", "skip_silence", "suppress_blank", "use_tqdm",
                     "word_timestamps"):
            if not isinstance(getattr(self, name), bool):
                _fail(name, "True or False", getattr(self, name))
        if self.vad_filter is not None and not isinstance(self.vad_filter, bool):
            _fail("vad_filter", "None (on for inputs longer than one 30 s window), True or False", self.vad_filter)
        if self.task not in TASKS:
            _fail("task", f"one of {TASKS}", self.task)
        if self.language is not None and (not isinstance(self.language, str) or not self.language.strip()):
            _fail("language", "None or a language code or name such as 'en' or 'german'", self.language)
        for name in ("max_new_tokens", "max_in_flight"):
            value = getattr(self, name)
            if value is not None and not (_integer(value) and value >= 1):
                _fail(name, "None or an int >= 1", value)

    def _check_decoding(self) -> None:
        if not self.temperature or any(t < 0 for t in self.temperature):
            _fail("temperature", "one or more numbers >= 0", self.temperature)
        if self.beam_width is not None and not (_integer(self.beam_width) and self.beam_width >= 1):
            _fail("beam_width", f"None (the default: {DEFAULT_BEAM_WIDTH}) or an int >= 1", self.beam_width)
        if not (_integer(self.best_of) and self.best_of >= 1):
            _fail("best_of", "an int >= 1", self.best_of)
        if not (_integer(self.seed) and self.seed >= 0):
            _fail("seed", "an int >= 0", self.seed)
        clips = self.clip_timestamps
        if any(t < 0 for t in clips) or any(b < a for a, b in zip(clips, clips[1:])):
            _fail("clip_timestamps", "seconds >= 0 in increasing order (start,end,start,end,...)", clips)

    def _check_thresholds(self) -> None:
        limits = {"compression_ratio_threshold": ("None or a number > 0", lambda v: v > 0),
                  "log_prob_threshold": ("None or a number <= 0", lambda v: v <= 0),
                  "no_speech_threshold": ("None or a number from 0 to 1", lambda v: 0 <= v <= 1)}
        for name, (limit, ok) in limits.items():
            value = getattr(self, name)
            if value is not None and not (_number(value) and ok(value)):
                _fail(name, limit, value)
        if not (_number(self.prompt_reset_on_temperature) and self.prompt_reset_on_temperature >= 0):
            _fail("prompt_reset_on_temperature", "a number >= 0", self.prompt_reset_on_temperature)
        limit = self.max_audio_seconds
        if limit is not None and not (_number(limit) and limit > 0):
            _fail("max_audio_seconds", "None or a number of seconds > 0", limit)
        threshold = self.hallucination_silence_threshold
        if threshold is not None and not (_number(threshold) and threshold > 0):
            _fail("hallucination_silence_threshold", "None or a number of seconds > 0", threshold)

    def _check_text(self) -> None:
        for name in ("prefix", "hotwords"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value.strip()):
                _fail(name, "None or non-blank text", value)
        if isinstance(self.initial_prompt, str) and not self.initial_prompt.strip():
            _fail("initial_prompt", "None, non-blank text or token ids", self.initial_prompt)

    def to_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)


def with_default_beam(options: TranscriptionOptions, max_beam_width: int) -> TranscriptionOptions:
    """`options` with beam_width set: as given, else DEFAULT_BEAM_WIDTH capped at the engine's max_beam_width (an
    engine of few sequences still transcribes with the defaults; a width given above the cap is refused later)."""
    if options.beam_width is not None:
        return options
    return dataclasses.replace(options, beam_width=max(1, min(DEFAULT_BEAM_WIDTH, max_beam_width)))


def resolve_options(options: Optional[TranscriptionOptions], overrides: Dict[str, Any]) -> TranscriptionOptions:
    """`options` (default: TranscriptionOptions()) with the keyword overrides applied, each named as its field or
    as faster-whisper / openai-whisper name it (option_aliases.py). An unknown name is a TypeError naming the
    closest valid one; an alias and its field with different values a ParameterError naming both."""
    if options is not None and not isinstance(options, TranscriptionOptions):
        raise TypeError(f"options must be a TranscriptionOptions, got {type(options).__name__}")
    overrides = resolve_aliases(overrides, field_names())
    base = options or TranscriptionOptions()
    return dataclasses.replace(base, **overrides) if overrides else base


def field_names() -> Sequence[str]:
    return [field.name for field in dataclasses.fields(TranscriptionOptions)]
