"""``GET /health`` (no token: container health checks use it) and ``GET /envs``."""

from __future__ import annotations

from fastapi import APIRouter

from envs.hosting.child import rss_bytes
from servers.dependencies import Manager
from servers.schemas import EnvsResponse, HealthResponse

router = APIRouter(tags=["meta"])


@router.get("/health", response_model=HealthResponse)
async def health(manager: Manager) -> HealthResponse:
    """200 once the server is ready (workers started), with load and memory."""
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
    """The env ids this server serves."""
    return EnvsResponse(env_ids=manager.settings.env_ids)
