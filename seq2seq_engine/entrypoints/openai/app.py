"""The FastAPI application: routes, error handlers, middleware and the browser page over the served models."""
from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from seq2seq_engine.entrypoints.openai.audio import create_transcription
from seq2seq_engine.entrypoints.openai.chat import chat_prompt_token_ids, create_chat_completion
from seq2seq_engine.entrypoints.openai.completions import create_completion
from seq2seq_engine.entrypoints.openai.errors import APIError, check_size, install_error_handlers
from seq2seq_engine.entrypoints.openai.limits import MAX_DETOKENIZE_TOKENS
from seq2seq_engine.entrypoints.openai.lora_routes import add_lora_routes
from seq2seq_engine.entrypoints.openai.middleware import ApiKeyMiddleware, BodyLimitMiddleware
from seq2seq_engine.entrypoints.openai.params import check_model_name, check_sampling_limits, check_text_size
from seq2seq_engine.entrypoints.openai.protocol import (ChatCompletionRequest, CompletionRequest, DetokenizeRequest,
                                                        TokenizeRequest)
from seq2seq_engine.entrypoints.openai.realtime.route import add_realtime_route
from seq2seq_engine.entrypoints.openai.state import ServedModels, ServerState
from seq2seq_engine.entrypoints.openai.web_ui import PAGE_PATHS, PAGE_PREFIXES, add_ui_routes


def build_app(models: ServedModels) -> FastAPI:
    app = FastAPI(title="seq2seq-engine", docs_url=None, redoc_url=None)
    app.state.server = models
    install_error_handlers(app)
    app.add_middleware(BodyLimitMiddleware, max_bytes=models.settings.max_upload_bytes)
    ui = models.settings.ui
    app.add_middleware(ApiKeyMiddleware, api_key=models.settings.api_key, page_paths=PAGE_PATHS if ui else (),
                       page_prefixes=PAGE_PREFIXES if ui else ())
    _info_routes(app, models)
    _token_routes(app, models)
    _generation_routes(app, models)
    add_realtime_route(app, models)
    if models.settings.allow_runtime_lora_updating:
        add_lora_routes(app, models)
    if ui:
        add_ui_routes(app)
    return app


def _kind(state: ServerState) -> str:
    """A model card's `kind`: "audio" for a Whisper model (the audio endpoints, realtime), "text" otherwise."""
    return "audio" if state.takes_audio else "text"


def _info_routes(app: FastAPI, models: ServedModels) -> None:
    @app.get("/health")
    async def health() -> Response:
        if not models.alive:
            raise APIError("an engine loop has stopped", 503)
        return Response(status_code=200)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(models.states[0].metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/v1/models")
    async def list_models() -> JSONResponse:
        """The served models, then their LoRA adapters (vLLM's cards: `parent` is an adapter's base model, `root`
        the directory it was read from; `kind`, this server's own: "audio" or "text", its base model's for an
        adapter)."""
        cards = [{"id": state.model_name, "object": "model", "created": state.created, "owned_by": "seq2seq-engine",
                  "root": state.model_config.model, "parent": None, "max_model_len": state.model_config.max_model_len,
                  "kind": _kind(state)}
                 for state in models.states]
        cards += [{"id": adapter.name, "object": "model", "created": adapter.created, "owned_by": "seq2seq-engine",
                   "root": adapter.request.lora_path, "parent": adapter.base,
                   "max_model_len": models.base(adapter.base).model_config.max_model_len,
                   "kind": _kind(models.base(adapter.base))}
                  for adapter in models.loras.adapters.values()]
        return JSONResponse({"object": "list", "data": cards})


def _token_routes(app: FastAPI, models: ServedModels) -> None:
    @app.post("/tokenize")
    async def tokenize(body: TokenizeRequest) -> JSONResponse:
        check_model_name(body.model)
        state = models.resolve(body.model)
        if (body.prompt is None) == (body.messages is None):
            raise APIError("send either prompt or messages", param="prompt")
        tokenizer = state.need_tokenizer()
        if body.messages is not None:
            tokens = chat_prompt_token_ids(body.messages, state, add_generation_prompt=True)
        else:
            check_text_size(state.model_config, [body.prompt], "prompt")
            tokens = tokenizer.encode(body.prompt, add_special_tokens=body.add_special_tokens)
        return JSONResponse({"tokens": tokens, "count": len(tokens),
                             "max_model_len": state.model_config.max_model_len})

    @app.post("/detokenize")
    async def detokenize(body: DetokenizeRequest) -> JSONResponse:
        check_model_name(body.model)
        check_size("tokens", len(body.tokens), MAX_DETOKENIZE_TOKENS, "token ids")
        state = models.resolve(body.model)
        vocab_size = state.model_config.vocab_size
        bad = [token for token in body.tokens if not 0 <= token < vocab_size]
        if bad:
            raise APIError(f"tokens {bad[:5]} are outside the vocabulary [0, {vocab_size})", param="tokens")
        return JSONResponse({"prompt": state.need_tokenizer().decode(body.tokens)})


def _generation_routes(app: FastAPI, models: ServedModels) -> None:
    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        check_sampling_limits(body)
        return await create_completion(body, request, models.target(body.model))

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        check_sampling_limits(body)
        return await create_chat_completion(body, request, models.target(body.model))

    @app.post("/v1/audio/transcriptions")
    async def transcriptions(request: Request):
        return await create_transcription(request, models, "transcribe")

    @app.post("/v1/audio/translations")
    async def translations(request: Request):
        return await create_transcription(request, models, "translate")
