"""Envs in threads of this process, behind the same interface as :class:`envs.hosting.pool.WorkerPool` (so
:class:`envs.hosting.sessions.SessionManager` runs over either). For light envs (math, code, the calculator); a
CPU-heavy env (ALFWorld: a reset holds the GIL for seconds) wants worker processes. The env work is the same
:class:`envs.hosting.child.EnvHost` handlers the worker processes run, so results and errors are the same."""

from __future__ import annotations

import asyncio
import contextlib
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from envs.hosting.child import EnvHost, raise_for_status
from envs.hosting.errors import EnvFailed
from envs.hosting.pool import StepReply

__all__ = ["ThreadEnvPool"]


class ThreadEnvPool:
    """Env sessions on ``max_workers`` threads; env work never runs on the event loop. Every closed env is closed
    (nothing is kept for reuse: unlike a worker process, a thread pool has no per-process resources to save).

    Raises (from each operation) ``EnvFailed``/``EnvRejected``/``EnvInfraFailed`` as the worker pool does, and
    ``KeyError`` for a session it does not hold.
    """

    def __init__(self, max_workers: int) -> None:
        if max_workers < 1:
            raise ValueError("max_workers must be >= 1")
        self._executor = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="local-env")
        self._host = EnvHost(keep_envs=0)
        self._owned: set[str] = set()
        self._pending: dict[str, asyncio.Future[Any]] = {}  # snapshot id -> its snapshot call still running

    async def _call(self, op: str, session_id: str, args: Any) -> Any:
        loop = asyncio.get_running_loop()
        status, payload, _ = await loop.run_in_executor(self._executor, self._host.handle, op, session_id, args)
        return raise_for_status(status, payload)

    async def prestart(self, n: int) -> None:
        """Nothing to start (threads start on first use)."""

    async def open(self, session_id: str, env_id: str, *, env_kwargs: dict[str, Any] | None = None,
                   seed: int | None = None, options: dict[str, Any] | None = None,
                   owner: str | None = None, may_generate: bool = True) -> tuple[Any, dict[str, Any]]:
        """``make_env(env_id, **env_kwargs)`` then ``reset(seed, options)`` on a thread -> ``(observation, info)``
        (``owner``: unused; the threads run any session's calls side by side; ``may_generate``:
        :mod:`envs.generation`)."""
        return await self._open(session_id, "open", (env_id, env_kwargs, seed, options, may_generate))

    async def _open(self, session_id: str, op: str, args: Any) -> tuple[Any, dict[str, Any]]:
        """Own ``session_id`` while ``op`` opens it (``open`` or ``restore``); not after a failure."""
        self._owned.add(session_id)
        try:
            observation, info = await self._call(op, session_id, args)
        except BaseException:
            self._owned.discard(session_id)
            raise
        return observation, info

    async def reset(self, session_id: str, *, seed: int | None = None, options: dict[str, Any] | None = None,
                    may_generate: bool = True) -> tuple[Any, dict[str, Any]]:
        """``env.reset(seed=seed, options=options)`` of an open session -> ``(observation, info)``."""
        if session_id not in self._owned:
            raise KeyError(session_id)
        observation, info = await self._call("reset", session_id, (seed, options, may_generate))
        return observation, info

    async def step(self, session_id: str, action: Any) -> StepReply:
        """``env.step(action)`` of an open session."""
        if session_id not in self._owned:
            raise KeyError(session_id)
        return StepReply(*await self._call("step", session_id, action))

    async def info(self, session_id: str, what: str, params: Any = None) -> Any:
        """What an open session's env declares (``"tools"``, ``"tasks"``: :meth:`envs.hosting.child.EnvHost.info`)."""
        if session_id not in self._owned:
            raise KeyError(session_id)
        return await self._call("info", session_id, (what, params))

    async def snapshot(self, session_id: str, snapshot_id: str) -> None:
        """Keep the open session's env state as ``snapshot_id`` (:meth:`EnvHost.snapshot`)."""
        if session_id not in self._owned:
            raise KeyError(session_id)
        loop = asyncio.get_running_loop()
        pending = self._pending[snapshot_id] = loop.run_in_executor(self._executor, self._host.handle, "snapshot",
                                                                    session_id, snapshot_id)
        try:  # a cancelled caller leaves the thread running: drop_snapshot waits for it first
            status, payload, _ = await asyncio.shield(pending)
        finally:
            if pending.done():
                self._pending.pop(snapshot_id, None)
        raise_for_status(status, payload)

    async def restore(self, session_id: str, snapshot_id: str, *, owner: str | None = None) -> tuple[Any, Any]:
        """Open ``session_id`` in the state of ``snapshot_id`` -> the source's last ``(observation, info)``."""
        if snapshot_id not in self._host.snapshots:
            raise KeyError(snapshot_id)
        return await self._open(session_id, "restore", snapshot_id)

    async def drop_snapshot(self, snapshot_id: str) -> None:
        """Free a snapshot (idempotent; after its snapshot call, if that still runs)."""
        pending = self._pending.pop(snapshot_id, None)
        if pending is not None:
            with contextlib.suppress(BaseException):
                await pending
        await self._call("drop_snapshot", "", snapshot_id)

    def broken_snapshots(self) -> list[str]:
        """Always empty: a thread does not die under a snapshot."""
        return []

    async def close(self, session_id: str) -> None:
        """Close the session's env (idempotent; an env that raises on close is dropped all the same)."""
        if session_id in self._owned:
            self._owned.discard(session_id)
            with contextlib.suppress(EnvFailed):
                await self._call("close", session_id, None)

    async def reap(self) -> None:
        """Nothing to reap (threads hold no per-session resources)."""

    def broken_sessions(self) -> list[str]:
        """Always empty: a thread does not die under a session."""
        return []

    def stats(self) -> dict[str, Any]:
        """Live sessions (the keys of :meth:`WorkerPool.stats` that apply to threads)."""
        return {"sessions": len(self._owned)}

    async def aclose(self) -> None:
        """Close every env and stop the threads."""
        self._owned.clear()
        await asyncio.get_running_loop().run_in_executor(self._executor, self._host.shutdown)
        self._executor.shutdown(wait=True)
