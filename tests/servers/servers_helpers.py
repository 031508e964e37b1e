"""Helpers of the server tests: an in-process app behind ``httpx.ASGITransport`` (lifespan run by hand), a real
uvicorn server in a thread, and free ports."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

import httpx
import uvicorn

import user_env_module  # noqa: F401  (registers user/Echo-v0 in this process)
from servers import wait as servers_wait
from servers.app import create_app
from waiting import HANG_S

CALC = "agent_rl/Calculator-v0"
ECHO = "user/Echo-v0"
CACHED = "user/CachedEcho-v0"  # declares a per-process task cache: groups share a worker


def make_app(env_ids: Sequence[str] = (CALC, ECHO), **kwargs: Any):
    """An app serving ``env_ids`` (the calculator and the user's echo env; workers import ``user_env_module``)."""
    kwargs.setdefault("max_sessions", 8)
    kwargs.setdefault("prestart_workers", 0)
    return create_app(list(env_ids), imports=["user_env_module"], **kwargs)


@contextlib.asynccontextmanager
async def serve_asgi(app: Any, token: str | None = None) -> AsyncIterator[httpx.AsyncClient]:
    """Run the app's lifespan and yield a client talking to it in-process."""
    headers = {"Authorization": f"Bearer {token}"} if token else None
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://localhost",
                                     headers=headers, timeout=60) as client:
            yield client


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def uvicorn_in_thread(app: Any, port: int, delay_s: float = 0.0) -> Iterator[uvicorn.Server]:
    """A real uvicorn server on 127.0.0.1:port in a thread, started after ``delay_s`` (to test client retries)."""
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on"))

    def run() -> None:
        time.sleep(delay_s)
        server.run()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def wait_healthy(url: str, timeout_s: float = HANG_S, proc: Any = None) -> None:
    """Poll ``GET /health`` until 200 (``servers.wait.wait_healthy``: ServerExited if ``proc`` exits, TimeoutError
    after ``timeout_s``, a ceiling that only catches a server that never serves)."""
    servers_wait.wait_healthy([url], timeout_s=timeout_s, interval_s=0.2, request_timeout_s=2.0, process=proc)
