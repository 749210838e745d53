"""Spoken-language detection through the engine: one decoder step on `<|startoftranscript|>`, argmax over the
language tokens (transformers' `WhisperForConditionalGeneration.detect_language`, openai-whisper's
`detect_language`).

The request is an ordinary greedy request with max_tokens=1 whose logits processor keeps only the language
tokens, so the sampled token is the argmax over them and its logprob (computed by the sampler from the processed
row) is the log-softmax over the language tokens alone: the detected language's probability.
"""
from __future__ import annotations

import math
from typing import Any, List, Sequence, Tuple

import torch

from seq2seq_engine.sampling_params import SamplingParams
from seq2seq_engine.transcription.decode.processors import OnlyTokens
from seq2seq_engine.transcription.prompts import WhisperTokens, whisper_tokens_for


def detection_params(tokens: WhisperTokens) -> SamplingParams:
    if not tokens.language_ids:
        raise ValueError("the tokenizer has no language tokens to detect a language with")
    return SamplingParams(temperature=0.0, max_tokens=1, logits_processors=[OnlyTokens(tokens.language_ids.values())])


def detection_prompt(tokens: WhisperTokens, features: torch.Tensor) -> dict:
    """The engine prompt for detecting the language of one window's log-mel features [n_mels, frames]."""
    return {"prompt_token_ids": tokens.detection_prompt(), "multi_modal_data": {"input_features": features}}


def parse_detection(output: Any, tokens: WhisperTokens) -> Tuple[str, float]:
    """(language code, probability) from the finished detection request's RequestOutput."""
    completion = output.outputs[0]
    if not completion.token_ids:
        raise ValueError(f"language detection request {output.request_id} produced no token")
    token_id = completion.token_ids[0]
    by_id = {token: code for code, token in tokens.language_ids.items()}
    if token_id not in by_id:
        raise ValueError(f"language detection produced token {token_id}, which is not a language token")
    logprob = completion.cumulative_logprob
    return by_id[token_id], (math.exp(logprob) if logprob is not None else float("nan"))


def detect_language(llm: Any, audio: Sequence[Any], use_tqdm: bool = False) -> List[Tuple[str, float]]:
    """(language code, probability) for each input (path, array at 16 kHz, or (array, sample_rate)), detected on
    its first 30 s. English-only models return ("en", 1.0) without running the model."""
    from seq2seq_engine.transcription.input.windows import features_for

    engine = getattr(llm, "llm_engine", llm)
    tokens = whisper_tokens_for(engine)
    inputs = list(audio)
    if not tokens.is_multilingual:
        return [("en", 1.0) for _ in inputs]
    from seq2seq_engine.audio import load_audio

    prompts = [detection_prompt(tokens, features_for(engine, load_audio(item))) for item in inputs]
    outputs = llm.generate(prompts, detection_params(tokens), use_tqdm=use_tqdm)
    return [parse_detection(output, tokens) for output in outputs]
