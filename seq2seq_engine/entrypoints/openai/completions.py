"""POST /v1/completions: text or token prompts (for an encoder/decoder model the encoder prompt, with an optional
`decoder_prompt`), sampled or beam-searched, as one JSON response or a server-sent event stream."""
from __future__ import annotations

import time
import uuid
from typing import Any, Dict, List

from fastapi.responses import JSONResponse
from starlette.requests import Request

from seq2seq_engine.entrypoints.openai.choices import (ChoiceTracker, Piece, check_ignored, stream_response, token_text,
                                                       usage)
from seq2seq_engine.entrypoints.openai.client import EngineRequests
from seq2seq_engine.entrypoints.openai.errors import APIError, check_size
from seq2seq_engine.entrypoints.openai.limits import MAX_PROMPTS
from seq2seq_engine.entrypoints.openai.params import (COMPLETIONS_DEFAULT_MAX_TOKENS, check_text_size,
                                                      default_max_tokens, engine_overrides, request_fields)
from seq2seq_engine.entrypoints.openai.protocol import CompletionRequest
from seq2seq_engine.entrypoints.openai.state import ServerState, Target


def engine_prompts(body: CompletionRequest, state: ServerState) -> List[Any]:
    """One engine prompt per prompt of the body (str, [str], [int] or [[int]])."""
    prompt = body.prompt
    if isinstance(prompt, str) or (prompt and isinstance(prompt[0], int)):
        prompts: List[Any] = [prompt]
    else:
        prompts = list(prompt)
    if not prompts:
        raise APIError("prompt must not be empty", param="prompt")
    check_size("prompt", len(prompts), MAX_PROMPTS, "prompts")
    for text in [p for p in prompts if isinstance(p, str)]:
        check_text_size(state.model_config, [text], "prompt")
    prompts = [p if isinstance(p, str) else {"prompt_token_ids": list(p)} for p in prompts]
    if body.decoder_prompt is None:
        return prompts
    if not state.is_encoder_decoder:
        raise APIError("decoder_prompt is for encoder/decoder models; this model is decoder-only",
                       param="decoder_prompt")
    if isinstance(body.decoder_prompt, str):
        check_text_size(state.model_config, [body.decoder_prompt], "decoder_prompt")
    decoder = body.decoder_prompt if isinstance(body.decoder_prompt, str) else {
        "prompt_token_ids": list(body.decoder_prompt)}
    return [{"encoder_prompt": p, "decoder_prompt": decoder} for p in prompts]


def _unsupported(body: CompletionRequest) -> None:
    if body.echo:
        raise APIError("echo is not supported", param="echo")
    if body.suffix:
        raise APIError("suffix is not supported", param="suffix")


async def create_completion(body: CompletionRequest, request: Request, target: Target):
    """The completion on the model `target` names (with its LoRA adapter, if it names one)."""
    state = target.state
    _unsupported(body)
    prompts = engine_prompts(body, state)
    max_tokens = default_max_tokens(state.engine.generation_defaults, body.max_tokens, None,
                                    state.model_config.max_model_len, COMPLETIONS_DEFAULT_MAX_TOKENS)
    overrides = engine_overrides(body, max_tokens, body.logprobs)
    response_id = request.headers.get("x-request-id") or f"cmpl-{uuid.uuid4().hex}"
    requests = EngineRequests(state.loop, request, response_id)
    request_ids = await requests.submit(prompts, [dict(overrides) for _ in prompts],
                                        fields=request_fields(body, chat=False), lora_request=target.lora)
    incremental = body.n == 1 and (body.best_of or 1) == 1 and not body.use_beam_search
    tracker = ChoiceTracker(request_ids, body.n, incremental)
    headers = {"X-Request-Id": response_id}
    head = {"id": response_id, "object": "text_completion", "created": int(time.time()), "model": target.name}
    if body.stream:
        return stream_response(requests, tracker, head, body, lambda piece: _choice(piece, state), headers)
    async with requests:
        finals = await requests.final_outputs()
    check_ignored(finals.values())
    choices = [_choice(piece, state) for piece in tracker.final_pieces(finals)]
    return JSONResponse({**head, "choices": choices, "usage": usage(finals.values(), body.n)}, headers=headers)


def _choice(piece: Piece, state: ServerState) -> Dict[str, Any]:
    return {"index": piece.index, "text": piece.text, "logprobs": _logprobs(piece, state),
            "finish_reason": piece.finish_reason}


def _logprobs(piece: Piece, state: ServerState):
    """OpenAI's completion logprobs: tokens, token_logprobs, top_logprobs, text_offset."""
    if piece.logprobs is None:
        return None
    tokens = [token_text(state.tokenizer, token_id) for token_id in piece.token_ids]
    offsets, position = [], 0
    for token in tokens:
        offsets.append(position)
        position += len(token)
    return {"tokens": tokens,
            "token_logprobs": [entry.get(token_id) for token_id, entry in zip(piece.token_ids, piece.logprobs)],
            "top_logprobs": [{token_text(state.tokenizer, t): value for t, value in entry.items()}
                             for entry in piece.logprobs],
            "text_offset": offsets}
