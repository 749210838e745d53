"""POST /v1/chat/completions: the messages rendered with the tokenizer's chat template, then generated as a
completion of those tokens (JSON response or server-sent event stream)."""
from __future__ import annotations

import time
import uuid
from typing import Any, Dict, List

from fastapi.responses import JSONResponse
from starlette.requests import Request

from seq2seq_engine.entrypoints.openai.choices import (ChoiceTracker, Piece, check_ignored, stream_response, token_text,
                                                       usage)
from seq2seq_engine.entrypoints.openai.client import EngineRequests
from seq2seq_engine.entrypoints.openai.errors import APIError
from seq2seq_engine.entrypoints.openai.params import (check_messages, check_text_size, default_max_tokens,
                                                      engine_overrides, request_fields)
from seq2seq_engine.entrypoints.openai.protocol import ChatCompletionRequest, ChatMessage
from seq2seq_engine.entrypoints.openai.state import ServerState, Target


def chat_prompt_token_ids(messages: List[ChatMessage], state: ServerState, add_generation_prompt: bool) -> List[int]:
    """The conversation through the tokenizer's chat template, as token ids (the template writes the special
    tokens itself, so none are added)."""
    check_messages(messages)
    tokenizer = state.need_tokenizer()
    if state.is_encoder_decoder or not getattr(tokenizer, "chat_template", None):
        raise APIError(f"the model {state.model_name!r} has no chat template; use /v1/completions", param="messages")
    conversation = [{"role": message.role, "content": message.text()} for message in messages]
    check_text_size(state.model_config, [turn["content"] for turn in conversation], "messages")
    try:
        text = tokenizer.apply_chat_template(conversation, tokenize=False,
                                             add_generation_prompt=add_generation_prompt)
    except Exception as error:  # a template may raise on a conversation it does not accept (jinja's raise_exception)
        raise APIError(f"the chat template refused the messages: {error}", param="messages") from None
    return tokenizer.encode(text, add_special_tokens=False)


async def create_chat_completion(body: ChatCompletionRequest, request: Request, target: Target):
    """The chat completion on the model `target` names (with its LoRA adapter, if it names one)."""
    state = target.state
    if body.max_tokens is not None and body.max_completion_tokens is not None:
        raise APIError("send max_completion_tokens or max_tokens, not both", param="max_completion_tokens")
    if body.top_logprobs is not None and not body.logprobs:
        raise APIError("top_logprobs needs logprobs=true", param="top_logprobs")
    token_ids = chat_prompt_token_ids(body.messages, state, body.add_generation_prompt)
    requested = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    max_tokens = default_max_tokens(state.engine.generation_defaults, requested, len(token_ids),
                                    state.model_config.max_model_len, None,
                                    "max_tokens" if body.max_completion_tokens is None else "max_completion_tokens")
    overrides = engine_overrides(body, max_tokens, (body.top_logprobs or 0) if body.logprobs else None)
    response_id = request.headers.get("x-request-id") or f"chatcmpl-{uuid.uuid4().hex}"
    requests = EngineRequests(state.loop, request, response_id)
    request_ids = await requests.submit([{"prompt_token_ids": token_ids}], [overrides], param="messages",
                                        fields=request_fields(body, chat=True), lora_request=target.lora)
    incremental = body.n == 1 and (body.best_of or 1) == 1 and not body.use_beam_search
    tracker = ChoiceTracker(request_ids, body.n, incremental)
    headers = {"X-Request-Id": response_id}
    if body.stream:
        head = {"id": response_id, "object": "chat.completion.chunk", "created": int(time.time()),
                "model": target.name}
        return stream_response(requests, tracker, head, body, lambda piece: _chunk_choice(piece, state), headers)
    async with requests:
        finals = await requests.final_outputs()
    check_ignored(finals.values())
    choices = [{"index": piece.index, "message": {"role": "assistant", "content": piece.text},
                "logprobs": _logprobs(piece, state), "finish_reason": piece.finish_reason}
               for piece in tracker.final_pieces(finals)]
    return JSONResponse({"id": response_id, "object": "chat.completion", "created": int(time.time()),
                         "model": target.name, "choices": choices, "usage": usage(finals.values(), body.n)},
                        headers=headers)


def _chunk_choice(piece: Piece, state: ServerState) -> Dict[str, Any]:
    delta = {"role": "assistant", "content": piece.text} if piece.first else {"content": piece.text}
    return {"index": piece.index, "delta": delta, "logprobs": _logprobs(piece, state),
            "finish_reason": piece.finish_reason}


def _logprobs(piece: Piece, state: ServerState):
    """OpenAI's chat logprobs: per token its text, logprob, bytes and top_logprobs."""
    if piece.logprobs is None:
        return None
    content = []
    for token_id, entry in zip(piece.token_ids, piece.logprobs):
        text = token_text(state.tokenizer, token_id)
        top = [{"token": token_text(state.tokenizer, t), "logprob": value,
                "bytes": list(token_text(state.tokenizer, t).encode())} for t, value in list(entry.items())[1:]]
        content.append({"token": text, "logprob": entry.get(token_id), "bytes": list(text.encode()),
                        "top_logprobs": top})
    return {"content": content}
