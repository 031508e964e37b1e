"""``GET /health`` (no token: container health checks use it; its load fields need one) and ``GET /envs``."""

from __future__ import annotations

from fastapi import APIRouter, Request

from envs.hosting.child import rss_bytes
from servers.access import CLIENT_KEY
from servers.dependencies import Manager
from servers.openenv import openenv_path
from servers.schemas import EnvEntry, EnvsResponse, HealthResponse

router = APIRouter(tags=["meta"])


@router.get("/health", response_model=HealthResponse, response_model_exclude_none=True)
async def health(request: Request, manager: Manager) -> HealthResponse:
    """200 once the server is ready (workers started), with load and memory for a caller the gate named (a token,
    or any caller of a server without tokens); ``{"status": "ok"}`` alone for an unauthenticated health check."""
    if request.scope.get(CLIENT_KEY) is None:
        return HealthResponse()
    stats = manager.pool.stats()
    return HealthResponse(
        env_ids=manager.settings.env_ids,
        sessions=len(manager.sessions),
        max_sessions=manager.settings.max_sessions,
        workers=stats["workers"],
        idle_workers=stats["idle_workers"],
        started_workers=stats["started_workers"],
        worker_rss_mb=stats["worker_rss_mb"],
        worker_pids=[p for p in stats["worker_pids"] if p is not None],
        server_rss_mb=round(rss_bytes() / 2**20, 1),
        expired_sessions=manager.expired,
    )


envs_router = APIRouter(tags=["meta"])


@envs_router.get("/envs", response_model=EnvsResponse)
async def list_envs(manager: Manager) -> EnvsResponse:
    """The env ids this server serves, and each one's OpenEnv and MCP paths."""
    ids = manager.settings.env_ids
    return EnvsResponse(env_ids=ids, envs=[EnvEntry(env_id=e, openenv_path=openenv_path(e),
                                                    mcp_path=f"{openenv_path(e)}/mcp") for e in ids])
