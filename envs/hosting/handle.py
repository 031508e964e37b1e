"""Parent side of one worker process: :class:`WorkerHandle` starts it, sends one request at a time over a
``multiprocessing`` pipe and reads the reply with an event-loop reader (no thread sits between the loop and a
worker). A handle is bound to the event loop it first runs on."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from envs.hosting.child import raise_for_status, worker_main
from envs.hosting.errors import EnvFailed, EnvTimeout
from envs.procgroup import kill_group

__all__ = ["WorkerHandle"]

START_TIMEOUT_S = 600.0
"""Seconds a worker process may take to start before its first request's own timeout begins anyway (a hung start)."""


class WorkerHandle:
    """Parent-side handle of one worker process.

    One request at a time per worker (an ``asyncio.Lock``), so the worker is always waiting in ``recv`` when a
    request is sent and a send never blocks the event loop; the reply is read by an event-loop reader on the pipe
    (no thread hop). The exchange runs in its own task, so a cancelled caller never desynchronises the pipe: the
    reply is still consumed before the next request is sent.
    """

    def __init__(self, index: int, ctx: Any, imports: Sequence[str], reset_nice: int = 0, keep_envs: int = 1) -> None:
        self.index = index
        self.sessions: dict[str, str | None] = {}  # session id -> its task key
        self.owners: dict[str, str | None] = {}  # session id -> the client that opened it
        self.keys: OrderedDict[str, None] = OrderedDict()  # task keys recently opened here (LRU)
        self.resets = 0
        self.rss = 0
        self.idle_since = time.monotonic()
        self.alive = True
        self.process: Any = None
        self._conn: Any = None
        self._lock = asyncio.Lock()
        self._reply: asyncio.Future[Any] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        # Starting a process may block (the first start launches the forkserver, which imports the env modules),
        # so it runs on a thread.
        self._starter = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"env-worker-{index}")
        self._started = self._starter.submit(self._start, ctx, imports, reset_nice, keep_envs)
        self._starter.shutdown(wait=False)

    def _start(self, ctx: Any, imports: Sequence[str], reset_nice: int, keep_envs: int) -> None:
        parent_conn, child_conn = ctx.Pipe()
        # the environment as of this start, not as of the forkserver's (started once per process, perhaps long
        # before: a variable set since, e.g. a games folder or a bound, would otherwise never reach the worker)
        self.process = ctx.Process(target=worker_main, args=(child_conn, tuple(imports), reset_nice, keep_envs,
                                                             dict(os.environ)),
                                   daemon=True, name=f"env-worker-{self.index}")
        self.process.start()
        child_conn.close()
        self._conn = parent_conn

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    async def _ensure_started(self) -> None:
        if self._loop is not None:
            return
        await asyncio.wrap_future(self._started)
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self._conn.fileno(), self._on_readable)

    def _on_readable(self) -> None:
        try:
            message = self._conn.recv()
        except (EOFError, OSError):
            self._on_dead("its process exited")
            return
        reply, self._reply = self._reply, None
        if reply is not None and not reply.done():
            reply.set_result(message)

    def _on_dead(self, why: str) -> None:
        self.alive = False
        if self._loop is not None and self._conn is not None:
            with contextlib.suppress(Exception):
                self._loop.remove_reader(self._conn.fileno())
        reply, self._reply = self._reply, None
        if reply is not None and not reply.done():
            reply.set_exception(EnvFailed(f"env worker {self.index} died ({why})"))

    async def _exchange(self, message: tuple[str, str, Any]) -> tuple[str, Any, str, int]:
        async with self._lock:
            try:
                await self._ensure_started()
            except Exception as exc:
                self.alive = False
                raise EnvFailed(f"env worker {self.index} did not start: {exc!r}") from exc
            if not self.alive:
                raise EnvFailed(f"env worker {self.index} is gone")
            self._reply = asyncio.get_running_loop().create_future()
            try:
                self._conn.send(message)
            except (OSError, ValueError) as exc:
                self._on_dead(f"{type(exc).__name__} on send")
            return await self._reply

    async def call(self, op: str, session_id: str, args: Any, timeout_s: float | None) -> Any:
        """Run one request in the worker. Raises ``EnvFailed`` if the env raised or the worker died, and
        ``EnvTimeout`` (after killing the worker) if it did not answer within ``timeout_s`` (counted from when its
        process runs: a slow start is not a slow env)."""
        if not self.alive:
            raise EnvFailed(f"env worker {self.index} is gone")
        if not self._started.done():
            # The process's start (launching the forkserver, then a fork) is not the env's answer: a busy machine
            # makes it slow, not hung, so ``timeout_s`` starts once it runs. START_TIMEOUT_S only catches a start
            # that hangs (the exchange then reports the start's failure, or times out).
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(self._started)), START_TIMEOUT_S)
        exchange = asyncio.ensure_future(self._exchange((op, session_id, args)))
        exchange.add_done_callback(lambda t: t.cancelled() or t.exception())  # retrieved even if nobody waits
        try:
            status, payload, detail, rss = await asyncio.wait_for(asyncio.shield(exchange), timeout_s)
        except asyncio.TimeoutError:
            self.kill()
            raise EnvTimeout(f"env did not answer {op!r} within {timeout_s} s; its worker was ended") from None
        self.rss = rss
        return raise_for_status(status, payload)

    def kill(self) -> None:
        """End the process and its process group now (no goodbye: what its envs started goes with it); a pending
        request fails with ``EnvFailed``."""
        if self.process is not None:
            kill_group(self.process.pid)  # the worker leads its own group (worker_main: own_session)
            if self.process.is_alive():
                self.process.kill()
        self._on_dead("killed")

    async def stop(self, timeout_s: float = 5.0) -> None:
        """Close its envs and end the process; kill it if it does not exit within ``timeout_s``."""
        if self.alive and self._loop is not None:
            with contextlib.suppress(Exception):
                await self.call("shutdown", "", None, timeout_s)
        self._on_dead("stopped")
        with contextlib.suppress(Exception):
            await asyncio.wrap_future(self._started)
        if self._conn is not None:
            self._conn.close()  # a worker still waiting for requests sees EOF and exits
        process = self.process
        if process is not None:
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(None, process.join, timeout_s)
            if process.is_alive():
                process.kill()
                await loop.run_in_executor(None, process.join, timeout_s)
            kill_group(process.pid)  # what its envs started and left behind
