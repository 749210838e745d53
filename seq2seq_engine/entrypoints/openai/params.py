"""From a request body to the engine's request parameters: the fields the client sent, as overrides of the model's
generation_config.json defaults (a dict the engine turns into SamplingParams or BeamSearchParams, which validate
them), the request field behind each engine parameter, and the bounds on the fields (limits.py)."""
from __future__ import annotations

from typing import Any, Dict, Iterable, Optional, Sequence

from seq2seq_engine.entrypoints.openai.errors import APIError, check_size
from seq2seq_engine.entrypoints.openai.limits import (MAX_BAD_WORD_CHARS, MAX_BAD_WORDS, MAX_CONTENT_PARTS,
                                                      MAX_MESSAGE_NAME_CHARS, MAX_MESSAGES, MAX_MODEL_CHARS,
                                                      MAX_STOP_CHARS, MAX_STOP_STRINGS, MAX_STOP_TOKEN_IDS,
                                                      MAX_USER_CHARS, MAX_VOCABULARY_IDS, PROMPT_CHARS_PER_TOKEN)

# Request fields passed to the engine under the same name when sent.
_PASSED = ("temperature", "top_p", "top_k", "min_p", "seed", "presence_penalty", "frequency_penalty",
           "repetition_penalty", "min_tokens", "ignore_eos", "stop_token_ids", "skip_special_tokens",
           "include_stop_str_in_output", "no_repeat_ngram_size", "bad_words", "allowed_token_ids")
# OpenAI's default max_tokens for /v1/completions when neither the client nor the model sets one.
COMPLETIONS_DEFAULT_MAX_TOKENS = 16


def check_text_size(model_config: Any, texts: Iterable[str], param: str) -> None:
    """A 400 naming `param` when the texts together are longer than the model's context could hold."""
    context = max(model_config.max_model_len, model_config.max_source_positions or 0)
    limit, size = PROMPT_CHARS_PER_TOKEN * context, sum(len(text) for text in texts)
    if size > limit:
        raise APIError(f"{param} has {size} characters, more than this model can take: {limit} "
                       f"({PROMPT_CHARS_PER_TOKEN} per token of its {context}-token context)", param=param)


def check_model_name(model: Optional[str]) -> None:
    """A 400 naming `model` when the name sent is longer than any served name can be (limits.py)."""
    if model is not None:
        check_size("model", len(model), MAX_MODEL_CHARS, "characters")


def check_sampling_limits(body: Any) -> None:
    """A 400 naming the first field of a completions or chat body past its bound (limits.py)."""
    check_model_name(body.model)
    check_size("user", len(body.user or ""), MAX_USER_CHARS, "characters")
    stops = [body.stop] if isinstance(body.stop, str) else body.stop or []
    check_size("stop", len(stops), MAX_STOP_STRINGS, "strings")
    for index, stop in enumerate(stops):
        check_size("stop", len(stop), MAX_STOP_CHARS, "characters", subject=f"stop string {index}")
    check_size("bad_words", len(body.bad_words or []), MAX_BAD_WORDS, "words")
    for index, word in enumerate(body.bad_words or []):
        check_size("bad_words", len(word), MAX_BAD_WORD_CHARS, "characters", subject=f"bad word {index}")
    for name, limit in (("stop_token_ids", MAX_STOP_TOKEN_IDS), ("allowed_token_ids", MAX_VOCABULARY_IDS),
                        ("logit_bias", MAX_VOCABULARY_IDS)):
        check_size(name, len(getattr(body, name) or ()), limit, "entries")


def check_messages(messages: Sequence[Any]) -> None:
    """A 400 naming `messages` (or one message's field) past its count or size bound (limits.py)."""
    check_size("messages", len(messages), MAX_MESSAGES, "messages")
    for index, message in enumerate(messages):
        if isinstance(message.content, list):
            check_size(f"messages.{index}.content", len(message.content), MAX_CONTENT_PARTS, "parts")
        check_size(f"messages.{index}.name", len(message.name or ""), MAX_MESSAGE_NAME_CHARS, "characters")


def request_fields(body: Any, chat: bool) -> Dict[str, str]:
    """{engine parameter: the request field that set it} where the two differ, so a refusal names what was sent."""
    width = "best_of" if body.best_of is not None else "n"
    fields = {"beam_width": width, "best_of": width}
    if chat:
        fields["logprobs"] = "top_logprobs" if body.top_logprobs is not None else "logprobs"
        if body.max_completion_tokens is not None:
            fields["max_tokens"] = "max_completion_tokens"
    return fields


def engine_overrides(body: Any, max_tokens: Optional[int], logprobs: Optional[int]) -> Dict[str, Any]:
    """The overrides dict for `LLMEngine.add_request(..., params=dict)`: every sampling field the client sent, n /
    best_of as sampling sequences, or use_beam_search as a beam search of width best_of (or n)."""
    overrides: Dict[str, Any] = {name: getattr(body, name) for name in _PASSED if getattr(body, name) is not None}
    if body.stop is not None:
        overrides["stop"] = [body.stop] if isinstance(body.stop, str) else list(body.stop)
    if body.logit_bias:
        overrides["logit_bias"] = _logit_bias(body.logit_bias)
    overrides["max_tokens"] = max_tokens
    if logprobs is not None:
        overrides["logprobs"] = logprobs
    if body.use_beam_search:
        return _beam_overrides(body, overrides)
    for name in ("length_penalty", "early_stopping"):
        if getattr(body, name) is not None:
            raise APIError(f"{name} applies to beam search only (use_beam_search=true)", param=name)
    if body.n != 1:
        overrides["n"] = body.n
    if body.best_of is not None:
        overrides["best_of"] = body.best_of
    if body.n > 1 or (body.best_of or 1) > 1:
        overrides.setdefault("temperature", 1.0)  # several sequences need sampling (OpenAI's default temperature)
    return overrides


def _beam_overrides(body: Any, overrides: Dict[str, Any]) -> Dict[str, Any]:
    width = body.best_of or body.n
    if width < body.n:
        raise APIError(f"best_of ({width}) must be >= n ({body.n}) for beam search", param="best_of")
    for name in ("top_p", "top_k", "min_p", "seed"):
        if name in overrides:
            raise APIError(f"{name} does not apply to beam search (use_beam_search=true)", param=name)
    if overrides.get("temperature", 0) != 0:
        raise APIError("beam search is deterministic: temperature must be 0 or not sent", param="temperature")
    overrides.pop("temperature", None)
    overrides["beam_width"] = width
    for name in ("length_penalty", "early_stopping"):
        if getattr(body, name) is not None:
            overrides[name] = getattr(body, name)
    return overrides


def _logit_bias(logit_bias: Dict[str, float]) -> Dict[int, float]:
    try:
        return {int(token_id): float(bias) for token_id, bias in logit_bias.items()}
    except ValueError:
        raise APIError(f"logit_bias keys must be token ids, got {sorted(logit_bias)[:5]}",
                       param="logit_bias") from None


def default_max_tokens(generation_defaults: Any, requested: Optional[int], prompt_len: Optional[int],
                       max_model_len: int, fallback: Optional[int], param: str = "max_tokens") -> Optional[int]:
    """max_tokens as sent (`param` names its field: at least 1, at most the model's context); else the model's
    max_new_tokens; else `fallback` (16 for completions); else, with the prompt length known (chat), the rest of
    the model's context; else None (the engine's own default)."""
    if requested is not None:
        if not 1 <= requested <= max_model_len:
            raise APIError(f"{param} must be >= 1 and <= the model's max_model_len ({max_model_len}), got "
                           f"{requested}", param=param)
        return requested
    model_default = generation_defaults.values.get("max_new_tokens")
    if model_default is not None:
        return int(model_default)
    if fallback is not None:
        return fallback
    if prompt_len is not None:
        return max(1, max_model_len - prompt_len)
    return None
