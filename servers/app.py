"""The env server's app factory: one FastAPI app serving any registered gymnasium env ids.

    app = create_app(["agent_rl/ALFWorld-v0"], max_sessions=64, token=None)

Layout: ``routers/`` (thin routes of our session API), ``openenv.py`` (each env's OpenEnv surface, HTTP and WS, under
``/envs/<env id>``), ``mcp.py`` (its MCP server, ``/envs/<env id>/mcp``), ``errors.py`` (one error mapping for every
surface), ``access.py`` (who may call: the gate in front of every surface, each client's own sessions),
``dependencies.py`` (the session manager from ``lifespan``, the caller), ``settings.py`` (the server's settings),
``schemas.py`` (bodies); sessions, env worker processes and their errors are :mod:`envs.hosting` (shared
with the in-process client), and every surface uses the same ones.
Errors are HTTP codes with a JSON body ``{"detail": str, "code": str}``, never an error inside a 200. Every answer is
valid UTF-8 JSON: a lone UTF-16 surrogate in a request is a 422 (``servers.schemas``), and any text an answer echoes
(the validation errors' ``input``, an env's message) has its lone surrogates replaced by U+FFFD
(:func:`envs.hosting.jsonable.scrub_text`; env observations and ``info`` get the same in the env host).
"""

from __future__ import annotations

import importlib
from collections.abc import AsyncIterator, Iterable
from contextlib import AsyncExitStack, asynccontextmanager

import gymnasium
from fastapi import Depends, FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from starlette.routing import Route

import envs  # noqa: F401  (registers the built-in ids)
from envs.hosting import SessionManager
from envs.hosting.errors import HTTP_ERRORS, EnvNotReady
from envs.hosting.jsonable import scrub_text, to_jsonable
from servers.access import AccessGate
from servers.dependencies import get_client
from servers.errors import describe_error
from servers.mcp import EnvMCP
from servers.middleware import BodyGuardMiddleware
from servers.openenv import EnvFacts, build_router, openenv_path
from servers.routers import meta, sessions
from servers.settings import ServerSettings

__all__ = ["create_app"]

_HTTP_CODES = {400: "invalid_task", 401: "unauthorized", 403: "forbidden", 404: "not_found", 405: "method_not_allowed",
               413: "action_too_large", 501: "not_implemented"}


def _error(status: int, code: str, detail: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"detail": scrub_text(detail), "code": code}, status_code=status, headers=headers)


def create_app(
    env_ids: Iterable[str],
    *,
    max_sessions: int = 64,
    session_ttl_s: float = 600.0,
    workers: int | None = None,
    token: str | None = None,
    max_action_bytes: int = 64 * 1024,
    imports: Iterable[str] = (),
    **settings: object,
) -> FastAPI:
    """Build the app.

    Args:
        env_ids: gymnasium ids to serve (registered after ``import envs`` and the ``imports``).
        max_sessions: live sessions at most (503 + ``Retry-After`` beyond).
        session_ttl_s: idle sessions are closed after this many seconds.
        workers: worker processes at most (``None``: ``max_sessions``, one process per live session).
        token: the token of one client, required on every route but the health checks (``servers.access``).
        max_action_bytes: largest action in UTF-8 bytes (413 beyond).
        imports: modules to import first (in the server and in every worker), e.g. a user's module that calls
            ``gymnasium.register``.
        **settings: other :class:`servers.settings.ServerSettings` fields (``prestart_workers``, ``check_envs``,
            ``env_timeout_s``, ``max_sessions_per_worker``, ``max_resets_per_worker``, ``max_worker_rss_mb``;
            ``tokens``: ``{client name: token}`` instead of ``token``; ``allowed_origins``: browser origins allowed).

    Raises:
        ValueError: an env id is not registered (the message lists the registered ``agent_rl/`` ids), or a setting
            is invalid (an empty token included).
    """
    imports = list(imports)
    for name in imports:
        importlib.import_module(name)
    env_ids = list(dict.fromkeys(env_ids))
    unknown = [e for e in env_ids if e not in gymnasium.registry]
    if unknown or not env_ids:
        known = sorted(e for e in gymnasium.registry if "/" in e)
        raise ValueError(f"unknown env ids {unknown or env_ids}; registered: {known} (use --import to register yours)")
    config = ServerSettings(env_ids=env_ids, max_sessions=max_sessions, session_ttl_s=session_ttl_s,
                            workers=workers, token=token, max_action_bytes=max_action_bytes, imports=imports,
                            **settings)  # type: ignore[arg-type]

    facts = {env_id: EnvFacts(env_id) for env_id in env_ids}
    mcps = {env_id: EnvMCP(env_id, facts[env_id], config) for env_id in env_ids}

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        manager = SessionManager(config)
        try:
            await manager.start()  # EnvNotReady: an env that cannot reset never gets a green /health
        except EnvNotReady as exc:
            app.state.startup_error = str(exc)
            raise
        app.state.manager = manager
        try:
            async with AsyncExitStack() as stack:
                for server in mcps.values():
                    await stack.enter_async_context(server.run(manager))
                yield
        finally:
            await manager.aclose()  # graceful shutdown: every env closed, every worker ended

    app = FastAPI(title="agent_rl env server", version="0.1.0", lifespan=lifespan,
                  description=f"Sessions of gymnasium text envs: {', '.join(env_ids)}")
    app.state.settings = config
    app.add_middleware(BodyGuardMiddleware, max_body_bytes=config.max_body_bytes,
                       max_json_depth=config.max_json_depth)
    app.add_middleware(AccessGate, settings=config)  # outermost: Host, Origin, token before any body is read
    app.include_router(meta.router)
    app.include_router(meta.envs_router, dependencies=[Depends(get_client)])
    app.include_router(sessions.router, dependencies=[Depends(get_client)])
    app.include_router(sessions.snapshots_router, dependencies=[Depends(get_client)])
    # OpenEnv (HTTP, WS) and MCP under each env's path; a one-env server answers them at its root too (not /health)
    for env_id in env_ids:
        app.include_router(build_router(env_id, facts[env_id]), prefix=openenv_path(env_id))
        app.router.routes.append(Route(f"{openenv_path(env_id)}/mcp", endpoint=mcps[env_id],
                                       methods=["GET", "POST", "DELETE"]))
    if len(env_ids) == 1:
        app.include_router(build_router(env_ids[0], facts[env_ids[0]], health=False))
        app.router.routes.append(Route("/mcp", endpoint=mcps[env_ids[0]], methods=["GET", "POST", "DELETE"]))
    app.state.mcp = mcps

    async def _hosting_error(request: Request, exc: Exception) -> JSONResponse:
        # POST /sessions, POST /snapshots/{id}/restore (and the stateless OpenEnv routes while they open one): a failure means no session exists;
        # on /step or /reset the open session was closed
        path = request.url.path.rstrip("/")
        opening = getattr(request.state, "opening", path == "/sessions"
                          or (path.startswith("/snapshots/") and path.endswith("/restore")))
        status, code, detail = describe_error(exc, opening=opening)
        headers = {"Retry-After": str(config.retry_after_s)} if status == 503 else None
        return _error(status, code, detail, headers=headers)

    for cls, _, _ in HTTP_ERRORS:  # status and code of each: envs.hosting.errors.HTTP_ERRORS
        app.add_exception_handler(cls, _hosting_error)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        # FastAPI's own answer (the list of errors, each echoing its ``input``), made valid Unicode: the default
        # handler cannot encode an echoed lone surrogate and the client got a 500 instead of this 422
        return JSONResponse({"detail": to_jsonable(jsonable_encoder(exc.errors()))}, status_code=422)

    @app.exception_handler(HTTPException)
    async def _http(request: Request, exc: HTTPException) -> JSONResponse:
        return _error(exc.status_code, _HTTP_CODES.get(exc.status_code, "error"), str(exc.detail),
                      headers=getattr(exc, "headers", None))

    return app
