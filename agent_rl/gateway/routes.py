"""The gateway's HTTP app: its routes (an ``APIRouter`` over a :class:`~agent_rl.gateway.app.Gateway`), its
OpenAI-shaped errors, and the access gate and body guard around it (the security model: :mod:`agent_rl.gateway.app`).
A route checks the body's text, finds the request's session and hands the call to the gateway."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from agent_rl.gateway.limits import check_text
from agent_rl.gateway.recorder import RequestError
from agent_rl.gateway.responses import response_events
from agent_rl.gateway.schemas import (ChatCompletionRequest, CompletionRequest, ResponsesRequest, RewardRequest,
                                      StepRequest)
from agent_rl.gateway.streaming import chat_chunks, completion_chunks
from servers.access import AccessGate
from servers.middleware import BodyGuardMiddleware


log = logging.getLogger(__name__)

ROUTES = ("GET /v1/models", "POST /v1/chat/completions", "POST /v1/completions", "POST /v1/responses",
          "POST /sessions/<id>/reward", "POST /env/sessions/<env session>/step", "GET /health",
          "(each /v1 route also under /sessions/<id>/v1)")
"""What the gateway serves (named by the 404 of any other route)."""


def error_body(message: str, code: str, param: str | None = None,
               kind: str = "invalid_request_error") -> dict[str, Any]:
    """OpenAI's error shape ``{"error": {"message", "type", "param", "code"}}`` (plus ``detail`` and ``code`` at the
    top, the env servers' shape, for clients of both)."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}, "detail": message,
            "code": code}


def _error(status: int, message: str, code: str, param: str | None = None) -> JSONResponse:
    return JSONResponse(error_body(message, code, param), status_code=status)


def add_error_handlers(app: FastAPI) -> None:
    """Answer every error OpenAI-shaped: a refused request (its status and code), a body that fails its schema
    (400 ``invalid_request``, ``invalid_text`` for a lone surrogate), an unknown route (404 ``unknown_route``
    naming :data:`ROUTES`) or method (405), and a bug (500 ``internal_error``, logged)."""

    @app.exception_handler(RequestError)
    async def _request_error(_: Request, exc: RequestError) -> JSONResponse:
        return _error(exc.status, str(exc), exc.code, exc.param)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        loc = [str(p) for p in first.get("loc", ())]
        where = ".".join(loc)
        code = "invalid_text" if first.get("type") == "string_unicode" else "invalid_request"  # lone surrogate
        param = loc[1] if len(loc) > 1 and loc[0] == "body" else None
        return _error(400, f"{where}: {first.get('msg', 'invalid request')}"[:500], code, param)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code in (404, 405):
            what = "not found" if exc.status_code == 404 else f"does not take {request.method}"
            return _error(exc.status_code, f"{request.method} {request.url.path[:200]}: {what}; this gateway "
                                           f"serves {', '.join(ROUTES)}", "unknown_route" if
                          exc.status_code == 404 else "method_not_allowed")
        return _error(exc.status_code, str(exc.detail), "http_error")

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:  # a bug: logged, still OpenAI-shaped
        log.error("gateway: %s %s failed", request.method, request.url.path[:200], exc_info=exc)
        return JSONResponse(error_body(f"internal error ({type(exc).__name__})", "internal_error",
                                       kind="server_error"), status_code=500)


def gateway_router(gateway: Any) -> APIRouter:
    """The gateway's routes: the ``/v1`` routes (also under ``/sessions/{sid}``), the reward, the env step and
    ``/health``; each model call runs in its session (:meth:`SessionStore.call_session`) and streams when asked.
    ``gateway``: the :class:`~agent_rl.gateway.app.Gateway` (typed ``Any``: ``app.py`` imports this module)."""
    router = APIRouter()
    store = gateway.store

    def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": gateway.model_name, "object": "model", "created": 0,
                                            "owned_by": "agent_rl"}]}

    async def chat(request: Request, body: ChatCompletionRequest, sid: str | None = None) -> Any:
        check_text(body)
        with store.call_session(request, sid) as session:
            result = await gateway.chat(session, body)
        if not body.stream:
            return result
        include_usage = bool((body.stream_options or {}).get("include_usage"))
        return StreamingResponse(chat_chunks(result, include_usage), media_type="text/event-stream")

    async def responses(request: Request, body: ResponsesRequest, sid: str | None = None) -> Any:
        check_text(body)
        session = store.resolve(request, sid)
        result = await gateway.responses(session, body)
        if not body.stream:
            return result
        return StreamingResponse(response_events(result), media_type="text/event-stream")

    async def completions(request: Request, body: CompletionRequest, sid: str | None = None) -> Any:
        check_text(body)
        with store.call_session(request, sid) as session:
            result = await gateway.completion(session, body)
        if not body.stream:
            return result
        return StreamingResponse(completion_chunks(result), media_type="text/event-stream")

    async def reward(request: Request, sid: str, body: RewardRequest) -> dict[str, Any]:
        check_text(body)
        session = store.resolve(request, sid, open_new=False)  # a reward names an episode that exists
        return gateway.post_reward(session, body)

    async def env_step(request: Request, env_sid: str, body: StepRequest) -> Any:
        check_text(body)
        session = store.resolve(request, None, open_new=False)
        return await gateway.env_step(session, env_sid, body.action)

    async def health() -> dict[str, Any]:
        return {"status": "ok"}

    for prefix in ("", "/sessions/{sid}"):
        router.add_api_route(prefix + "/v1/models", models, methods=["GET"])
        router.add_api_route(prefix + "/v1/chat/completions", chat, methods=["POST"])
        router.add_api_route(prefix + "/v1/completions", completions, methods=["POST"])
        router.add_api_route(prefix + "/v1/responses", responses, methods=["POST"])
    router.add_api_route("/sessions/{sid}/reward", reward, methods=["POST"])
    router.add_api_route("/env/sessions/{env_sid}/step", env_step, methods=["POST"])
    router.add_api_route("/health", health, methods=["GET"])
    return router


def build_app(gateway: Any) -> Any:
    """The gateway's ASGI app: :func:`gateway_router` with OpenAI-shaped errors, behind the body guard
    (``limits.max_body_bytes``, JSON depth) and the access gate (bearer tokens of ``gateway.settings``)."""
    app = FastAPI(title="agent_rl gateway", docs_url=None, redoc_url=None, openapi_url=None)
    add_error_handlers(app)
    app.include_router(gateway_router(gateway))

    def refusal(status: int, code: str, message: str) -> dict[str, Any]:
        return error_body(message, code)

    guarded = BodyGuardMiddleware(app, gateway.limits.max_body_bytes, render=refusal)
    return AccessGate(guarded, gateway.settings, render=refusal)
