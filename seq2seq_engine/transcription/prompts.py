"""Whisper's special token ids, read from the tokenizer and generation config, and the decoder prompts built on them.

    info = WhisperTokens.from_model(tokenizer, hf_config, model_dir)
    info.prompt(language="de", task="translate", timestamps=False)
        -> [<|startoftranscript|>, <|de|>, <|translate|>, <|notimestamps|>]
    info.prompt(previous_tokens=[...])
        -> [<|startofprev|>, ...the last 223 previous tokens..., <|startoftranscript|>, ...]
    info.prompt(prefix_tokens=[...])
        -> [<|startoftranscript|>, <|notimestamps|>, ...prefix...]   ([..., <|0.00|>, ...prefix...] with timestamps)

The prompts are the ones transformers' `WhisperForConditionalGeneration.generate` builds (`_retrieve_init_tokens`,
`_prepare_decoder_input_ids`): `<|startoftranscript|>`, then for a multilingual model the language and the task
token, then `<|notimestamps|>` unless timestamps are wanted. English-only models (`*.en`) get no language or task
token: `<|startoftranscript|><|notimestamps|>`. Token ids are never hard-coded: every id comes from the tokenizer.
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Dict, List, Optional, Sequence, Tuple

from seq2seq_engine.engine_port import EnginePort
from seq2seq_engine.errors import ParameterError
from seq2seq_engine.transcription.language_table import LANGUAGES, TO_LANGUAGE_CODE

SOT, EOT, NO_TIMESTAMPS = "<|startoftranscript|>", "<|endoftext|>", "<|notimestamps|>"
TRANSCRIBE, TRANSLATE, START_OF_PREV = "<|transcribe|>", "<|translate|>", "<|startofprev|>"
START_OF_LM, NO_SPEECH, NO_CAPTIONS = "<|startoflm|>", "<|nospeech|>", "<|nocaptions|>"  # older vocabularies
TASKS = ("transcribe", "translate")
TIME_PRECISION = 0.02  # seconds per timestamp token step
# openai-whisper's default `max_initial_timestamp` (1.0 s) in timestamp steps; used when the model's generation
# config does not name `max_initial_timestamp_index`.
DEFAULT_MAX_INITIAL_TIMESTAMP_INDEX = 50
# The default number of new tokens per 30 s window: openai-whisper's `sample_len = n_text_ctx // 2`.
DEFAULT_MAX_NEW_TOKENS = 224


@dataclasses.dataclass(frozen=True)
class WhisperTokens:
    """The ids a Whisper transcription needs, for one model and tokenizer."""

    sot: int
    eot: int
    no_timestamps: int
    vocab_size: int
    max_target_positions: int
    is_multilingual: bool
    language_ids: Dict[str, int]          # language code ("en", "de", ...) -> <|code|> id, in id order
    transcribe: Optional[int] = None
    translate: Optional[int] = None
    start_of_prev: Optional[int] = None
    start_of_lm: Optional[int] = None
    no_speech: Optional[int] = None       # <|nospeech|> (<|nocaptions|> in the older vocabularies)
    suppress_tokens: Tuple[int, ...] = ()
    begin_suppress_tokens: Tuple[int, ...] = ()
    max_initial_timestamp_index: Optional[int] = DEFAULT_MAX_INITIAL_TIMESTAMP_INDEX

    @property
    def timestamp_begin(self) -> int:
        """Id of `<|0.00|>`: the timestamp tokens follow `<|notimestamps|>`."""
        return self.no_timestamps + 1

    @property
    def prompt_cut_off(self) -> int:
        """How many previous tokens a `<|startofprev|>` prompt keeps (HF/openai: max_target_positions // 2 - 1)."""
        return self.max_target_positions // 2 - 1

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_model(cls, tokenizer: Any, hf_config: Any = None, model_dir: Optional[str] = None) -> "WhisperTokens":
        """Read the ids from `tokenizer`; vocabulary size, context length and the suppress lists from the model's
        config and `generation_config.json` (when `model_dir` holds one)."""
        if tokenizer is None:
            raise ValueError("transcription needs the model's tokenizer (the engine runs with "
                             "skip_tokenizer_init=True)")
        generation = _generation_config(model_dir)
        vocab = _special_vocab(tokenizer)
        missing = [token for token in (SOT, EOT, NO_TIMESTAMPS) if token not in vocab]
        if missing:
            raise ValueError(f"the tokenizer has no {', '.join(missing)}: not a Whisper tokenizer")
        sot, eot, no_timestamps = vocab[SOT], vocab[EOT], vocab[NO_TIMESTAMPS]
        vocab_size = int(getattr(hf_config, "vocab_size", None) or len(tokenizer))
        max_target = int(getattr(hf_config, "max_target_positions", None) or 448)
        translate, transcribe = vocab.get(TRANSLATE), vocab.get(TRANSCRIBE)
        # The language tokens lie between <|startoftranscript|> and the first task token.
        task_ids = [t for t in (translate, transcribe) if t is not None]
        end = min(task_ids) if task_ids else sot + 1
        language_ids = {}
        for token_id in range(sot + 1, end):
            token = tokenizer.convert_ids_to_tokens(token_id)
            if isinstance(token, str) and token.startswith("<|") and token.endswith("|>"):
                language_ids[token[2:-2]] = token_id
        is_multilingual = generation.get("is_multilingual")
        if is_multilingual is None:
            is_multilingual = vocab_size >= 51865  # openai-whisper's rule: English-only models have 51864 tokens
        suppress = generation.get("suppress_tokens", getattr(hf_config, "suppress_tokens", None)) or []
        begin = generation.get("begin_suppress_tokens", getattr(hf_config, "begin_suppress_tokens", None)) or []
        initial = generation.get("max_initial_timestamp_index", DEFAULT_MAX_INITIAL_TIMESTAMP_INDEX)
        if "no_timestamps_token_id" in generation and generation["no_timestamps_token_id"] != no_timestamps:
            raise ValueError(f"generation_config.json names <|notimestamps|> {generation['no_timestamps_token_id']} "
                             f"but the tokenizer has it at {no_timestamps}")
        return cls(sot=sot, eot=eot, no_timestamps=no_timestamps, vocab_size=vocab_size,
                   max_target_positions=max_target, is_multilingual=bool(is_multilingual), language_ids=language_ids,
                   transcribe=transcribe, translate=translate, start_of_prev=vocab.get(START_OF_PREV),
                   start_of_lm=vocab.get(START_OF_LM), no_speech=vocab.get(NO_SPEECH, vocab.get(NO_CAPTIONS)),
                   suppress_tokens=tuple(int(t) for t in suppress), begin_suppress_tokens=tuple(int(t) for t in begin),
                   max_initial_timestamp_index=None if initial is None else int(initial))

    # ------------------------------------------------------------------ languages
    def language_code(self, language: str) -> str:
        """Normalise "en", "English", "<|en|>" (any case) to the code "en"; ValueError for unknown languages."""
        if not isinstance(language, str) or not language.strip():
            raise ParameterError(f"language must be a non-empty string such as 'en' or 'english', got {language!r}",
                                 "language")
        text = language.strip().lower()
        if text.startswith("<|") and text.endswith("|>"):
            text = text[2:-2]
        code = text if text in self.language_ids or text in LANGUAGES else TO_LANGUAGE_CODE.get(text)
        if not self.is_multilingual:
            if code == "en":
                return "en"
            raise ParameterError(f"this model is English-only; language {language!r} is not supported (use None or "
                                 f"'en')", "language")
        if code is None or code not in self.language_ids:
            known = ", ".join(sorted(self.language_ids))
            raise ParameterError(f"unsupported language {language!r}; this model knows: {known}", "language")
        return code

    # ------------------------------------------------------------------ prompts
    def prompt(self, language: Optional[str] = None, task: str = "transcribe", timestamps: bool = False,
               previous_tokens: Optional[Sequence[int]] = None,
               prefix_tokens: Optional[Sequence[int]] = None) -> List[int]:
        """The decoder prompt for one window.

        language: a code/name for multilingual models (required there: detect it first); ignored ("en") for
        English-only models. previous_tokens: text (and timestamp) tokens of the preceding window(s); the last
        `prompt_cut_off` of them follow `<|startofprev|>` before `<|startoftranscript|>`. prefix_tokens: text the
        window's transcript starts with, after the task tokens (after `<|0.00|>` with timestamps, as faster-whisper).
        """
        if task not in TASKS:
            raise ParameterError(f"task must be one of {TASKS}, got {task!r}", "task")
        tokens = [self.sot]
        if self.is_multilingual:
            if language is None:
                raise ParameterError("a multilingual model needs a language for its prompt (detect it first)",
                                     "language")
            tokens.append(self.language_ids[self.language_code(language)])
            task_id = self.transcribe if task == "transcribe" else self.translate
            if task_id is None:
                raise ValueError(f"the tokenizer has no <|{task}|> token")
            tokens.append(task_id)
        else:
            if task != "transcribe":
                raise ParameterError(f"this model is English-only: task {task!r} is not supported (use 'transcribe')",
                                     "task")
            if language is not None:
                self.language_code(language)  # validates: only English
        if not timestamps:
            tokens.append(self.no_timestamps)
        if prefix_tokens:
            tokens += ([self.timestamp_begin] if timestamps else []) + [int(t) for t in prefix_tokens]
        if previous_tokens:
            if self.start_of_prev is None:
                raise ValueError("the tokenizer has no <|startofprev|> token to condition on previous text")
            kept = [int(t) for t in previous_tokens][-self.prompt_cut_off:] if self.prompt_cut_off > 0 else []
            tokens = [self.start_of_prev] + kept + tokens
        return tokens

    def detection_prompt(self) -> List[int]:
        """The language-detection prompt: `<|startoftranscript|>` alone (HF `detect_language`)."""
        return [self.sot]

    def max_new_tokens(self, prompt_length: int, requested: Optional[int] = None) -> int:
        """New tokens for a window: `requested` (default DEFAULT_MAX_NEW_TOKENS) capped to the decoder context."""
        wanted = DEFAULT_MAX_NEW_TOKENS if requested is None else int(requested)
        if wanted < 1:
            raise ParameterError(f"max_new_tokens must be >= 1, got {requested}", "max_new_tokens")
        room = self.max_target_positions - prompt_length
        if room < 1:
            raise ValueError(f"the decoder prompt ({prompt_length} tokens) fills the decoder context "
                             f"({self.max_target_positions})")
        return min(wanted, room)

    def is_text(self, token_id: int) -> bool:
        return token_id < self.eot

    def is_timestamp(self, token_id: int) -> bool:
        return token_id >= self.timestamp_begin


def whisper_tokens_for(engine: EnginePort) -> WhisperTokens:
    """The WhisperTokens of the engine's model (read once per transcribe call; no module-level cache)."""
    if engine.num_mel_bins is None:
        raise ValueError(f"model {engine.model_path!r} takes no audio (its config has no num_mel_bins): "
                         f"transcription needs a Whisper model")
    return WhisperTokens.from_model(engine.tokenizer, engine.hf_config, engine.model_path)


def _special_vocab(tokenizer: Any) -> Dict[str, int]:
    """Token -> id for the added/special tokens the prompts need (unknown tokens are left out)."""
    wanted = (SOT, EOT, NO_TIMESTAMPS, TRANSCRIBE, TRANSLATE, START_OF_PREV, START_OF_LM, NO_SPEECH, NO_CAPTIONS)
    ids = tokenizer.convert_tokens_to_ids(list(wanted))
    unk = getattr(tokenizer, "unk_token_id", None)
    out = {}
    for token, token_id in zip(wanted, ids):
        if token_id is None:
            continue
        # Whisper's unk token is <|endoftext|>: an unknown token maps to its id, a real <|endoftext|> does too.
        if token_id == unk and token != EOT and tokenizer.convert_ids_to_tokens(token_id) != token:
            continue
        out[token] = int(token_id)
    return out


def _generation_config(model_dir: Optional[str]) -> Dict[str, Any]:
    if not model_dir:
        return {}
    path = os.path.join(model_dir, "generation_config.json")
    if not os.path.isfile(path):
        return {}
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
