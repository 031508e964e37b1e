"""The gateway's HTTP server inside the running event loop (uvicorn as a task: requests are served on the trainer's
loop, where the generation batcher lives; programs call it from their own threads or processes)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, Iterator

import uvicorn

from servers.protocol import BODY_TIMEOUT_S, HEADER_TIMEOUT_S, header_timeout_protocol
from servers.tokens import is_loopback_bind


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:  # the trainer keeps its own SIGINT/SIGTERM handling
        yield


class GatewayServer:
    """uvicorn serving ``app`` on ``host:port`` (port 0: a free one, :attr:`port` once started) in this loop.

    Args:
        host: bind address; a non-loopback one needs ``allow_remote=True`` (the gateway serves the machine's own
            programs by default).
        header_timeout_s, body_timeout_s: a connection that has not sent a whole request head, or after it the
            whole body, in this many seconds is closed (:mod:`servers.protocol`).

    Raises:
        ValueError: a non-loopback ``host`` without ``allow_remote``.
    """

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0, *, allow_remote: bool = False,
                 header_timeout_s: float = HEADER_TIMEOUT_S, body_timeout_s: float = BODY_TIMEOUT_S) -> None:
        if not is_loopback_bind(host) and not allow_remote:
            raise ValueError(f"gateway host {host!r} is not loopback; pass allow_remote (--allow-remote) to serve "
                             "other machines (every request still needs the token)")
        self.host, self.port = host, port
        self._server = _Server(uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="off",
                                              http=header_timeout_protocol(header_timeout_s, body_timeout_s),
                                              access_log=False))
        self._task: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    async def start(self) -> None:
        """Serve, returning once the socket listens (``RuntimeError`` if uvicorn stopped first)."""
        self._task = asyncio.create_task(self._server.serve())
        while not self._server.started:
            if self._task.done():
                self._task.result()
                raise RuntimeError(f"the gateway could not start on {self.host}:{self.port}")
            await asyncio.sleep(0.02)
        sockets = [s for server in self._server.servers for s in server.sockets]
        self.port = int(sockets[0].getsockname()[1])

    async def stop(self) -> None:
        if self._task is None:
            return
        self._server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._task = None
