"""The engine requests of a live transcription: Whisper prompts (language, prompt text) and greedy parameters,
built by the same DecodePlan the file transcription uses, and the text of a finished decode."""
from __future__ import annotations

import dataclasses
import math
from typing import Any, List, Optional

import numpy as np

from seq2seq_engine.audio import SAMPLE_RATE
from seq2seq_engine.engine_port import EnginePort
from seq2seq_engine.transcription.decode.decode_params import DecodePlan, WindowPrompt
from seq2seq_engine.transcription.decode.fallback import compression_ratio
from seq2seq_engine.transcription.decode.language import detection_params, detection_prompt
from seq2seq_engine.transcription.decode.processors import SuppressTokensAtBegin
from seq2seq_engine.transcription.input.windows import features_for
from seq2seq_engine.transcription.live.decode_request import DecodeRequest
from seq2seq_engine.transcription.options import TranscriptionOptions
from seq2seq_engine.transcription.prompts import WhisperTokens, whisper_tokens_for

# An interim decode gets at most 16 + 12 tokens per second of its audio (speech runs at 3-6 tokens a second): a
# decode of a turn cut mid-word that falls into a repetition loop ends early instead of running to 224 tokens.
INTERIM_TOKENS_BASE, INTERIM_TOKENS_PER_SECOND = 16, 12
# An interim hypothesis more repetitive than this (gzip compression ratio, Whisper's fallback rule) is not used.
INTERIM_MAX_COMPRESSION = 2.4


class LiveDecoder:
    """Builds each decode of a live turn from an EnginePort (its tokenizer, mel bins, window, device): the
    features of the samples, the prompt `[<|startofprev|> prompt text] <|startoftranscript|> [language, task]
    <|notimestamps|>`, and temperature-0 greedy parameters with the model's suppress lists (as `transcribe` with
    temperature=0.0 and beam_width=1 decodes a window); every request carries `lora_request` (a LoRARequest or
    None), the adapter its owner submits it with."""

    def __init__(self, engine: EnginePort, tokens: WhisperTokens, lora_request: Optional[Any] = None) -> None:
        self.engine, self.tokens, self.lora_request = engine, tokens, lora_request
        greedy = TranscriptionOptions(temperature=0.0, beam_width=1, use_tqdm=False)   # a turn's latency first
        self.plan = DecodePlan(engine, tokens, greedy)

    @classmethod
    def for_engine(cls, engine: EnginePort, lora_request: Optional[Any] = None) -> "LiveDecoder":
        """ValueError when the engine's model takes no audio (or has no Whisper tokenizer)."""
        return cls(engine, whisper_tokens_for(engine), lora_request)

    @property
    def needs_language(self) -> bool:
        """A multilingual model's prompt names a language; English-only models need none."""
        return self.tokens.is_multilingual

    def check_language(self, language: Optional[str]) -> Optional[str]:
        """The language code of `language` (ValueError naming the languages the model knows); None stays None
        (a multilingual model's language is then detected: `detection_request`)."""
        return None if language is None else self.tokens.language_code(language)

    def detection_request(self, request_id: str, samples: np.ndarray) -> DecodeRequest:
        """The one-token request naming the language spoken in `samples` (read it with `language_of`)."""
        features = features_for(self.engine, samples)
        return DecodeRequest(request_id, detection_prompt(self.tokens, features), detection_params(self.tokens),
                             self.lora_request)

    def language_of(self, token_ids: List[int]) -> str:
        """The language code a finished detection request names; ValueError when it names none."""
        by_id = {token: code for code, token in self.tokens.language_ids.items()}
        if not token_ids or int(token_ids[0]) not in by_id:
            raise ValueError(f"language detection produced no language token: {list(token_ids)[:1]}")
        return by_id[int(token_ids[0])]

    def prompt_tokens(self, prompt_text: Optional[str]) -> List[int]:
        """The token ids of `prompt_text` as the text before the window (openai-whisper's `initial_prompt` rule)."""
        text = (prompt_text or "").strip()
        return list(self.engine.tokenizer.encode(" " + text, add_special_tokens=False)) if text else []

    def request(self, request_id: str, samples: np.ndarray, language: Optional[str], prompt_text: Optional[str],
                interim: bool = False, prefix_text: Optional[str] = None) -> DecodeRequest:
        """The greedy decode of `samples` (float32 16 kHz, at most one 30 s window) as an engine request. An
        `interim` one has fewer new tokens (INTERIM_TOKENS_BASE + INTERIM_TOKENS_PER_SECOND per second);
        `prefix_text` is forced as the start of the transcript (the output continues it: `text(ids, prefix_text)`),
        and then the end of text may come first (no blank or end-of-text suppression at the first new token)."""
        prefix = self.prompt_tokens(prefix_text)[:self.tokens.prompt_cut_off]
        token_ids = self.tokens.prompt(language, previous_tokens=self.prompt_tokens(prompt_text),
                                       prefix_tokens=prefix)
        params, _ = self.plan.params(WindowPrompt(token_ids, prefix), 0.0, 0)
        changes = {}
        if interim:
            cap = INTERIM_TOKENS_BASE + math.ceil(INTERIM_TOKENS_PER_SECOND * len(samples) / SAMPLE_RATE)
            changes["max_tokens"] = min(params.max_tokens, cap)
        if prefix:
            changes["logits_processors"] = [p for p in params.logits_processors
                                            if not isinstance(p, SuppressTokensAtBegin)]
        params = dataclasses.replace(params, **changes) if changes else params
        prompt = {"prompt_token_ids": token_ids,
                  "multi_modal_data": {"input_features": features_for(self.engine, samples)}}
        return DecodeRequest(request_id, prompt, params, self.lora_request)

    def text(self, token_ids: List[int], prefix_text: Optional[str] = None) -> str:
        """The text of a decode's output tokens (special and timestamp tokens left out), whitespace collapsed;
        after the forced `prefix_text` of its request."""
        token_ids = self.prompt_tokens(prefix_text)[:self.tokens.prompt_cut_off] + list(token_ids)
        text_ids = [int(t) for t in token_ids if self.tokens.is_text(int(t))]
        return " ".join(self.engine.tokenizer.decode(text_ids, skip_special_tokens=True).split()) if text_ids else ""

    @staticmethod
    def usable_interim(text: str) -> bool:
        """Whether an interim decode's text may be a hypothesis: not a repetition loop."""
        return compression_ratio(text) <= INTERIM_MAX_COMPRESSION
