"""``LocalEnvPool``: the env pool in this process (threads) or in worker processes, no HTTP.

A thin adapter over the env-hosting core the server runs too (:mod:`envs.hosting`: the same session manager, the
same worker pool or threads running the same env handlers), so the two differ only by HTTP (that is what
``benchmarks/bench_env_server.py`` measures). ``mode="thread"`` suits light envs (math, code, the calculator);
``mode="process"`` suits CPU-heavy envs (ALFWorld: a reset holds the GIL for seconds).
"""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import Awaitable, Iterable
from typing import Any, TypeVar

import envs  # noqa: F401  (registers the built-in ids)
from agent_rl.envclient.base import EnvClientError, EnvPoolBase, PoolCaps, ResetResult, StepResult, client_error
from envs.data import PATH_OPTIONS
from envs.hosting import SessionManager, SessionSettings, ThreadEnvPool, WorkerPool, env_module
from envs.hosting.errors import EnvInfraFailed, http_error

__all__ = ["LocalEnvPool"]

T = TypeVar("T")


class LocalEnvPool(EnvPoolBase):
    """In-process env sessions (implements :class:`agent_rl.envclient.EnvPool`); env work never runs on the event
    loop. Errors are those of ``HTTPEnvPool`` for the same situation (one rule, :func:`client_error`, on the
    server's status and code of each :mod:`envs.hosting.errors` exception), with ``status=None``: an env that raises
    closes its session (``EnvServerError``, with ``code="env_infra_error"`` when the env could not judge, see
    ``docs/env_errors.md``); ``make``/``reset`` refusing the kwargs, seed or options, an unknown env id, a
    non-``str`` action and text with a lone UTF-16 surrogate (``docs/servers.md``, "Text") are ``EnvClientError``
    (``code`` ``"invalid_request"``, ``"unknown_env"``, HTTP's 422/404).

    Args:
        max_workers: threads (``"thread"``) or worker processes (``"process"``, one session per process while
            they last).
        mode: ``"thread"`` or ``"process"``.
        max_sessions: live sessions at most (``EnvUnavailable`` beyond); ``None``: unbounded in thread mode,
            ``8 * max_workers`` in process mode.
        imports: modules to import first (a user's module that calls ``gymnasium.register``).
        preload_envs: process mode: env ids whose modules the workers' forkserver imports once (so each worker
            starts in milliseconds and shares that memory), e.g. ``["agent_rl/ALFWorld-v0"]``.
        max_snapshots: env-state snapshots kept at most (:meth:`snapshot`; ``EnvUnavailable`` beyond).
        refused_options: reset options refused as the env server refuses them (``EnvClientError``, 422
            ``invalid_request`` naming them): host paths (``envs.data.PATH_OPTIONS``, ALFWorld's ``gamefile``),
            since task rows are content and reach the env as reset options; ``()``: trust every option.
    """

    caps = PoolCaps(snapshots=True)

    def __init__(
        self,
        max_workers: int = 8,
        mode: str = "thread",
        *,
        max_sessions: int | None = None,
        imports: Iterable[str] = (),
        preload_envs: Iterable[str] = (),
        max_snapshots: int = 4096,
        refused_options: Iterable[str] = PATH_OPTIONS,
    ) -> None:
        if mode not in ("thread", "process"):
            raise ValueError(f"mode must be 'thread' or 'process', got {mode!r}")
        self.imports = list(imports)
        for name in self.imports:
            importlib.import_module(name)
        self.mode = mode
        self.max_sessions = max_sessions
        pool: ThreadEnvPool | WorkerPool
        if mode == "thread":
            pool = ThreadEnvPool(max_workers)
        else:
            preload = [m for e in preload_envs for m in env_module(e)]
            pool = WorkerPool(max_workers, imports=self.imports, preload=preload)
        settings = SessionSettings(env_ids=None, max_sessions=max_sessions, session_ttl_s=None,
                                   max_snapshots=max_snapshots, refused_options=tuple(refused_options),
                                   imports=self.imports, prestart_workers=0, check_envs=False)
        self.manager = SessionManager(settings, pool)

    async def _call(self, call: Awaitable[T]) -> T:
        """Await a session-manager call; a hosting error becomes the client error ``HTTPEnvPool`` raises for it."""
        try:
            return await call
        except Exception as exc:
            answer = http_error(exc)
            if answer is None:
                raise
            status, code = answer
            message = f"the env could not judge: {exc}" if isinstance(exc, EnvInfraFailed) else str(exc)
            raise client_error(message, status=status, code=code, session_route=True, in_process=True) from exc

    async def reset(
        self,
        env_id: str,
        *,
        seed: int | None = None,
        options: dict[str, Any] | None = None,
        env_kwargs: dict[str, Any] | None = None,
    ) -> ResetResult:
        """Open a session: ``envs.wrappers.make_env`` (``gymnasium.make`` + this package's wrappers) + ``reset`` off
        the event loop."""
        session_id, observation, info = await self._call(
            self.manager.create(env_id, seed=seed, options=options, env_kwargs=env_kwargs))
        return ResetResult(session_id, observation, info)

    async def step(self, session_id: str, action: str) -> StepResult:
        """``env.step(action)`` off the event loop."""
        if not isinstance(action, str):  # the HTTP API answers 422 (pydantic): same contract in-process
            raise EnvClientError(f"action must be a str, got {type(action).__name__}", code="invalid_request")
        reply = await self._call(self.manager.step(session_id, action))
        return StepResult(reply.observation, reply.reward, reply.terminated, reply.truncated, reply.info)

    async def snapshot(self, session_id: str) -> str:
        """Keep the session's env state (the env's ``clone_state()``) -> a snapshot id (:meth:`restore` opens a
        session in it). ``EnvClientError`` (``code="invalid_request"``) when the env has no
        ``clone_state``/``set_state``, ``EpisodeOver`` after its episode ended."""
        return await self._call(self.manager.snapshot(session_id))

    async def restore(self, snapshot_id: str) -> ResetResult:
        """A new session in a snapshot's state; its observation and info are the source's last
        (``SnapshotNotFound``)."""
        session_id, observation, info = await self._call(self.manager.restore(snapshot_id))
        return ResetResult(session_id, observation, info)

    async def drop_snapshot(self, snapshot_id: str) -> None:
        """Free a snapshot (idempotent)."""
        if snapshot_id in self.manager.snapshots:
            await self._call(self.manager.drop_snapshot(snapshot_id))

    async def close(self, session_id: str) -> None:
        """Close the session's env (idempotent)."""
        if session_id in self.manager.sessions:
            await self._call(self.manager.close(session_id))

    async def aclose(self) -> None:
        """Close every session and stop the threads or worker processes."""
        await asyncio.gather(*(self.close(s) for s in list(self.manager.sessions)), return_exceptions=True)
        await self.manager.aclose()

    async def __aenter__(self) -> LocalEnvPool:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()
