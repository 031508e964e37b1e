"""Session bookkeeping of an env server: ids, capacity, TTL, episode state and one-request-at-a-time per session.

The env work itself happens in :class:`servers.workers.WorkerPool`; this class only decides whether a request is
allowed (404/409/503 cases) and records what happened. Routes call it and map its exceptions to HTTP codes.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from servers.workers import AtCapacity, EnvFailed, StepReply, WorkerPool

__all__ = [
    "AtCapacity",
    "EnvFailed",
    "EnvNotReady",
    "EpisodeOver",
    "Session",
    "SessionBusy",
    "SessionExists",
    "SessionManager",
    "SessionNotFound",
    "ServerSettings",
    "UnknownEnv",
]


class SessionNotFound(KeyError):
    """No live session with this id (never created, closed, expired, or broken by an env failure)."""


class SessionExists(RuntimeError):
    """A live session already has the client-chosen session id."""


class UnknownEnv(KeyError):
    """The env id is not served by this server."""


class EpisodeOver(RuntimeError):
    """Step after the episode ended (terminated or truncated): reset the session first."""


class SessionBusy(RuntimeError):
    """Another request on the same session is still running."""


class EnvNotReady(RuntimeError):
    """A served env cannot make and reset with its defaults (missing or empty data, ...): the server refuses to
    start, so ``/health`` is never green on an env that cannot reset. The message is the env's own error, which
    names the resolved data path and the counts found."""


@dataclass
class ServerSettings:
    """Everything ``create_app`` is configured with (one place; ``GET /health`` reports it)."""

    env_ids: list[str]
    max_sessions: int = 64
    """Live sessions at most; one more is answered 503 + Retry-After."""
    session_ttl_s: float = 600.0
    """A session idle (no request) this long is closed."""
    workers: int | None = None
    """Worker processes at most; ``None``: ``max_sessions`` (one process per live session)."""
    max_sessions_per_worker: int = 8
    """Sessions sharing one worker at most (when workers run out, or to share a cached game)."""
    token: str | None = None
    """Bearer token required on every route but ``/health`` (``None``: open)."""
    max_action_bytes: int = 64 * 1024
    """Largest action (UTF-8 bytes) accepted; larger is 413."""
    imports: list[str] = field(default_factory=list)
    """Modules workers import first (a user's module that calls ``gymnasium.register``)."""
    prestart_workers: int = 1
    """Workers started at startup (starts the forkserver and imports the env modules before ``/health`` is up)."""
    env_timeout_s: float | None = 600.0
    """Seconds one env call may take; then its worker is killed and the session fails (504)."""
    max_resets_per_worker: int = 500
    """A worker is recycled when idle after this many resets (bounds any leak inside an env)."""
    max_worker_rss_mb: float | None = 2048.0
    """A worker is recycled when idle above this RSS (MiB)."""
    check_envs: bool = True
    """Before ``/health`` is up, open and reset one session of every served env with its defaults (no kwargs, no
    options) and refuse to start if one fails (:class:`EnvNotReady`). The env stays in its worker for reuse."""
    reset_nice: int = 10
    """Resets run this many nice levels below steps (needs CAP_SYS_NICE; 0: off), so they yield the cores to steps."""
    retry_after_s: int = 1
    """``Retry-After`` seconds sent with 503."""

    def __post_init__(self) -> None:
        """Raises ValueError on a setting the server could not run with (before any worker starts)."""
        bad = [f"{name}={getattr(self, name)!r}" for name, ok in [
            ("max_sessions", self.max_sessions >= 1), ("workers", self.workers is None or self.workers >= 0),
            ("max_sessions_per_worker", self.max_sessions_per_worker >= 1),
            ("max_action_bytes", self.max_action_bytes >= 1), ("session_ttl_s", self.session_ttl_s > 0),
            ("prestart_workers", self.prestart_workers >= 0),
            ("env_timeout_s", self.env_timeout_s is None or self.env_timeout_s > 0)] if not ok]
        if bad:
            raise ValueError(f"invalid server settings: {', '.join(bad)} (max_sessions, max_sessions_per_worker, "
                             "max_action_bytes >= 1; workers, prestart_workers >= 0; ttl, env_timeout > 0)")

    @property
    def max_body_bytes(self) -> int:
        """Largest request body: the action limit plus room for JSON escaping and the other fields."""
        return 6 * self.max_action_bytes + 64 * 1024


@dataclass
class Session:
    """One live env session (server side)."""

    session_id: str
    env_id: str
    created_at: float = field(default_factory=time.time)
    last_used: float = field(default_factory=time.monotonic)
    steps: int = 0
    episodes: int = 1
    done: bool = False
    busy: bool = False


class SessionManager:
    """Live sessions over a :class:`WorkerPool`, with capacity, TTL and per-session exclusivity."""

    def __init__(self, settings: ServerSettings) -> None:
        import servers.workers as workers_mod

        self.settings = settings
        preload = [m for e in settings.env_ids for m in workers_mod.env_module(e)]
        self.pool = WorkerPool(
            settings.workers or settings.max_sessions,
            max_sessions_per_worker=settings.max_sessions_per_worker,
            imports=settings.imports,
            preload=preload,
            max_resets_per_worker=settings.max_resets_per_worker,
            max_worker_rss_mb=settings.max_worker_rss_mb,
            timeout_s=settings.env_timeout_s,
            reset_nice=settings.reset_nice,
        )
        self.sessions: dict[str, Session] = {}
        self._reaper: asyncio.Task[None] | None = None
        self.expired = 0

    async def start(self) -> None:
        """Start the first workers, check that every env can serve, start the TTL reaper.

        Raises:
            EnvNotReady: a served env failed to make/reset with its defaults (``check_envs``); every worker is
                ended first.
        """
        await self.pool.prestart(self.settings.prestart_workers)
        if self.settings.check_envs:
            for env_id in self.settings.env_ids:
                probe = f"startup-check-{uuid.uuid4().hex}"
                try:
                    await self.pool.open(probe, env_id)
                except EnvFailed as exc:
                    await self.pool.aclose()
                    raise EnvNotReady(f"env {env_id} cannot serve, refusing to start: {exc}") from None
                await self.pool.close(probe)
        self._reaper = asyncio.create_task(self._reap_forever())

    async def aclose(self) -> None:
        """Graceful shutdown: stop the reaper, close every env, end every worker."""
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
        self.sessions.clear()
        await self.pool.aclose()

    async def _reap_forever(self) -> None:
        interval = max(0.05, min(self.settings.session_ttl_s / 4, 10.0))
        while True:
            await asyncio.sleep(interval)
            await self.reap()

    async def reap(self) -> None:
        """Close sessions idle longer than the TTL, drop broken ones, end long-idle workers."""
        now = time.monotonic()
        expired = [s.session_id for s in self.sessions.values()
                   if not s.busy and now - s.last_used > self.settings.session_ttl_s]
        for session_id in expired + self.pool.broken_sessions():
            if self.sessions.pop(session_id, None) is not None:
                self.expired += session_id in expired
            await self.pool.close(session_id)
        await self.pool.reap()

    # ---- helpers ---------------------------------------------------------------------------------------------
    def get(self, session_id: str) -> Session:
        """The live session, or ``SessionNotFound``."""
        try:
            return self.sessions[session_id]
        except KeyError:
            raise SessionNotFound(session_id) from None

    @contextlib.asynccontextmanager
    async def _exclusive(self, session_id: str) -> AsyncIterator[Session]:
        """Hold the session for one request: 409 (``SessionBusy``) if another request holds it; on an env
        failure the session is closed (the env's state is unknown) and ``EnvFailed`` propagates."""
        session = self.get(session_id)
        if session.busy:
            raise SessionBusy(f"session {session_id} is busy with another request")
        session.busy = True
        try:
            yield session
        except EnvFailed:
            self.sessions.pop(session_id, None)
            await self.pool.close(session_id)
            raise
        finally:
            session.busy = False
            session.last_used = time.monotonic()

    # ---- operations ------------------------------------------------------------------------------------------
    async def create(
        self,
        env_id: str,
        *,
        seed: int | None = None,
        options: dict[str, Any] | None = None,
        env_kwargs: dict[str, Any] | None = None,
        session_id: str | None = None,
    ) -> tuple[str, Any, dict[str, Any]]:
        """Open a session: ``gymnasium.make`` + ``reset`` in a worker -> ``(session_id, observation, info)``.

        ``session_id``: the client's choice (default: a new uuid4 hex), so a client that lost the answer can still
        close the session. Raises ``UnknownEnv`` (404), ``SessionExists`` (409), ``AtCapacity`` (503),
        ``EnvFailed`` (500/504).
        """
        if env_id not in self.settings.env_ids:
            raise UnknownEnv(f"env id {env_id!r} is not served here; served: {self.settings.env_ids}")
        if session_id is not None and session_id in self.sessions:
            raise SessionExists(f"a live session has the id {session_id!r}")
        if len(self.sessions) >= self.settings.max_sessions:
            raise AtCapacity(f"{len(self.sessions)} live sessions (max_sessions={self.settings.max_sessions})")
        session = Session(session_id or uuid.uuid4().hex, env_id, busy=True)
        self.sessions[session.session_id] = session
        try:
            observation, info = await self.pool.open(session.session_id, env_id, env_kwargs=env_kwargs, seed=seed,
                                                     options=options)
        except BaseException:
            self.sessions.pop(session.session_id, None)
            raise
        finally:
            session.busy = False
            session.last_used = time.monotonic()
        return session.session_id, observation, info

    async def reset(
        self, session_id: str, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        """Reset an open session -> ``(observation, info)``; raises as :meth:`step`."""
        async with self._exclusive(session_id) as session:
            observation, info = await self.pool.reset(session_id, seed=seed, options=options)
            session.done = False
            session.episodes += 1
        return observation, info

    async def step(self, session_id: str, action: Any) -> StepReply:
        """Step an open session. Raises ``SessionNotFound`` (404), ``EpisodeOver``/``SessionBusy`` (409),
        ``EnvFailed`` (500/504; the session is then closed)."""
        session = self.get(session_id)
        if session.done:
            raise EpisodeOver(f"episode of session {session_id} is over (terminated or truncated); reset it")
        async with self._exclusive(session_id) as session:
            reply = await self.pool.step(session_id, action)
            session.steps += 1
            session.done = reply.terminated or reply.truncated
        return reply

    async def close(self, session_id: str) -> None:
        """Close a session and free its env (404 if unknown)."""
        self.get(session_id)
        self.sessions.pop(session_id, None)
        await self.pool.close(session_id)
