"""Per-window decoding: the prompt (initial prompt, hotwords, previous text, prefix) and each attempt's request."""
from __future__ import annotations

import dataclasses
import hashlib
from typing import Any, List, Optional, Sequence, Tuple, Union

import torch

from seq2seq_engine.beam_search_params import BeamSearchParams
from seq2seq_engine.engine_port import EnginePort
from seq2seq_engine.errors import ParameterError
from seq2seq_engine.sampling_params import SamplingParams
from seq2seq_engine.transcription.decode.fallback import (Attempt, Thresholds, average_logprob, best_sample,
                                                          compression_ratio)
from seq2seq_engine.transcription.decode.processors import SuppressTokens, SuppressTokensAtBegin, WhisperTimestamps
from seq2seq_engine.transcription.options import TranscriptionOptions, with_default_beam
from seq2seq_engine.transcription.prompts import WhisperTokens

Params = Union[SamplingParams, BeamSearchParams]


class NoSpeechProbe:
    """A prompt-logits hook: P(`<|nospeech|>`) from the raw logits at the `<|startoftranscript|>` position, which is
    what openai-whisper, transformers and CTranslate2 report as no_speech_prob."""

    def __init__(self, token_id: int) -> None:
        self.token_id = token_id
        self.prob: Optional[float] = None

    def __call__(self, logits: torch.Tensor) -> None:
        self.prob = float(torch.softmax(logits.float(), dim=-1)[self.token_id])


class WithHistory:
    """A processor that sees `history` (the prompt's forced prefix) before the generated tokens, so the timestamp
    rules treat a prefix as text already in the window."""

    def __init__(self, processor: Any, history: Sequence[int]) -> None:
        self.processor = processor
        self.history = list(history)

    def __call__(self, output_token_ids: Sequence[int], logits: torch.Tensor) -> torch.Tensor:
        return self.processor(self.history + list(output_token_ids), logits)


@dataclasses.dataclass(frozen=True)
class WindowPrompt:
    token_ids: List[int]   # the decoder prompt
    forced: List[int]      # its tail that belongs to the window's transcript (<|0.00|> and the prefix)

    @property
    def has_prefix(self) -> bool:
        return bool(self.forced)


def attempt_seed(base: int, input_index: int, window_index: int, attempt: int) -> int:
    """A fixed 63-bit seed per (call seed, input, window, attempt): sampled attempts are reproducible."""
    digest = hashlib.blake2b(f"{base}:{input_index}:{window_index}:{attempt}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def suppress_ids(requested: Sequence[int], tokens: WhisperTokens) -> Tuple[int, ...]:
    """openai-whisper's suppress list: -1 stands for the model's own list (generation_config.json: non-speech
    symbols and special tokens); the task, start and no-speech tokens are always added."""
    ids = [t for t in requested if t >= 0]
    if -1 in requested:
        ids += list(tokens.suppress_tokens)
    ids += [t for t in (tokens.transcribe, tokens.translate, tokens.sot, tokens.start_of_prev, tokens.start_of_lm,
                        tokens.no_speech) if t is not None]
    outside = [t for t in ids if t >= tokens.vocab_size]
    if outside:
        raise ParameterError(f"suppress_tokens must be ids below the vocabulary size {tokens.vocab_size}, got "
                             f"{outside}", "suppress_tokens")
    return tuple(sorted(set(ids)))


class DecodePlan:
    """The per-call decoding facts; builds each window's prompt and each attempt's engine parameters."""

    def __init__(self, engine: EnginePort, tokens: WhisperTokens, options: TranscriptionOptions) -> None:
        options = with_default_beam(options, engine.max_beam_width)   # the width decided here
        self.tokens, self.options = tokens, options
        self.limits = Thresholds(options.compression_ratio_threshold, options.log_prob_threshold,
                                 options.no_speech_threshold)
        _check_engine_limits(engine, options)
        cut = tokens.prompt_cut_off

        def encode(text: Optional[str]) -> List[int]:
            return list(engine.tokenizer.encode(" " + text.strip(), add_special_tokens=False)) if text else []

        initial = options.initial_prompt
        self.initial_tokens = encode(initial) if isinstance(initial, str) else list(initial or [])
        self.prefix_tokens = encode(options.prefix)[:cut]
        self.hotword_tokens = encode(options.hotwords)[:cut]
        self.processors = self._processors(history=None)
        history = [tokens.timestamp_begin] + self.prefix_tokens
        self.prefix_processors = self._processors(history) if self.prefix_tokens else self.processors

    def _processors(self, history: Optional[List[int]]) -> List:
        tokens, options = self.tokens, self.options
        processors: List = []
        if options.suppress_blank and tokens.begin_suppress_tokens:
            processors.append(SuppressTokensAtBegin(tokens.begin_suppress_tokens))
        suppress = suppress_ids(options.suppress_tokens, tokens)
        if suppress:
            processors.append(SuppressTokens(suppress))
        if options.timestamps:
            rules = WhisperTimestamps(tokens.no_timestamps, tokens.eot, tokens.max_initial_timestamp_index)
            processors.append(WithHistory(rules, history) if history else rules)
        return processors

    def prompt(self, language: Optional[str], first: bool, previous: Sequence[int]) -> WindowPrompt:
        """An input's window prompt: `first` windows get the prefix; `previous` is the text conditioned on (the
        initial prompt and earlier windows); hotwords go before it unless the window has a prefix."""
        prefix = self.prefix_tokens if first else []
        previous = list(previous)
        if self.hotword_tokens and not prefix:
            room = max(self.tokens.prompt_cut_off - len(self.hotword_tokens), 0)
            previous = self.hotword_tokens + (previous[-room:] if room else [])
        token_ids = self.tokens.prompt(language, self.options.task, self.options.timestamps,
                                       previous_tokens=previous, prefix_tokens=prefix)
        forced = []
        if prefix:
            forced = ([self.tokens.timestamp_begin] if self.options.timestamps else []) + prefix
        return WindowPrompt(token_ids, forced)

    def params(self, prompt: WindowPrompt, temperature: float, seed: int) -> Tuple[Params, Optional[NoSpeechProbe]]:
        """One attempt's engine parameters: greedy or beam search at temperature 0, best_of seeded samples above."""
        max_tokens = self.tokens.max_new_tokens(len(prompt.token_ids), self.options.max_new_tokens)
        probe = NoSpeechProbe(self.tokens.no_speech) if self.tokens.no_speech is not None else None
        # The last <|startoftranscript|>: token ids given as initial_prompt could hold another.
        sot_index = len(prompt.token_ids) - 1 - prompt.token_ids[::-1].index(self.tokens.sot)
        hooks = [(sot_index, probe)] if probe is not None else None
        processors = self.prefix_processors if prompt.has_prefix else self.processors
        if temperature > 0:
            best_of = self.options.best_of
            params: Params = SamplingParams(n=best_of, best_of=best_of, temperature=temperature, seed=seed,
                                            max_tokens=max_tokens, logits_processors=processors,
                                            prompt_logits_hooks=hooks)
        elif self.options.beam_width > 1:
            params = BeamSearchParams(beam_width=self.options.beam_width, max_tokens=max_tokens,
                                      logits_processors=processors, prompt_logits_hooks=hooks)
        else:
            params = SamplingParams(temperature=0.0, max_tokens=max_tokens, logits_processors=processors,
                                    prompt_logits_hooks=hooks)
        return params, probe

    def attempt(self, output: Any, temperature: float, probe: Optional[NoSpeechProbe], decode: Any) -> Attempt:
        """The attempt a finished request made: its best sequence (beam search: the engine's best hypothesis;
        samples: openai-whisper's ranking) and the scores the fallback rules read."""
        samples = [(self._strip_eot(c.token_ids), c.cumulative_logprob or 0.0) for c in output.outputs]
        token_ids, cumulative = samples[0] if len(samples) == 1 or temperature == 0 else best_sample(samples)
        text = decode([t for t in token_ids if self.tokens.is_text(t)]).strip()
        return Attempt(token_ids, text, temperature, average_logprob(cumulative, len(token_ids)),
                       compression_ratio(text), probe.prob if probe is not None else None)

    def _strip_eot(self, token_ids: Sequence[int]) -> List[int]:
        token_ids = list(token_ids)
        return token_ids[:-1] if token_ids and token_ids[-1] == self.tokens.eot else token_ids


def _check_engine_limits(engine: EnginePort, options: TranscriptionOptions) -> None:
    max_beam_width = engine.max_beam_width
    if options.beam_width > max_beam_width:
        raise ParameterError(f"beam_width must be at most the engine's max_beam_width ({max_beam_width}), "
                             f"got {options.beam_width}", "beam_width")
    max_num_seqs = engine.max_num_seqs
    if any(t > 0 for t in options.temperatures) and options.best_of > max_num_seqs:
        raise ParameterError(f"best_of must be at most the engine's max_num_seqs ({max_num_seqs}) when a "
                             f"temperature is above 0, got {options.best_of}", "best_of")
