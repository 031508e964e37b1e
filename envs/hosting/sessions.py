"""The one session state machine of env hosting: ids, capacity, TTL, episode state and one request at a time per
session, over a pool of envs (:class:`envs.hosting.pool.WorkerPool` or :class:`envs.hosting.threads.ThreadEnvPool`).

This class only decides whether a request is allowed and records what happened; the env work happens in the pool.
The HTTP server (``servers/``) maps its exceptions (:mod:`envs.hosting.errors`) to status codes, and
``agent_rl.envclient.LocalEnvPool`` maps them to the client errors ``HTTPEnvPool`` raises for those codes, so both
behave the same.

States of a session: created (busy while its env is made and reset) -> ready -> busy (one request) -> ready, or
done (the episode terminated or was truncated: only ``reset`` and ``close`` are allowed) -> closed. An env failure
closes the session.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import gymnasium

from envs.hosting.errors import (
    AtCapacity,
    EnvFailed,
    EnvNotReady,
    EnvRejected,
    EpisodeOver,
    InvalidText,
    QuotaExceeded,
    SessionBusy,
    SessionExists,
    SessionNotFound,
    SnapshotNotFound,
    UnknownEnv,
)
from envs.hosting.jsonable import lone_surrogate
from envs.hosting.pool import StepReply, WorkerPool, env_module
from envs.jsondepth import MAX_JSON_DEPTH, value_depth

__all__ = ["EnvBackend", "Session", "SessionManager", "SessionSettings", "Snapshot"]

log = logging.getLogger(__name__)


@dataclass
class SessionSettings:
    """What a :class:`SessionManager` is configured with (the HTTP server extends it with its own fields)."""

    env_ids: list[str] | None
    """Env ids served; ``None``: any registered gymnasium id."""
    max_sessions: int | None = 64
    """Live sessions at most (``AtCapacity`` beyond; HTTP 503 + Retry-After); ``None``: no limit here."""
    session_ttl_s: float | None = 600.0
    """A session idle (no request) this long is closed; ``None``: never."""
    workers: int | None = None
    """Worker processes at most; ``None``: ``max_sessions`` (one process per live session)."""
    max_sessions_per_worker: int = 8
    """Sessions sharing one worker at most (when workers run out, or to share a cached game)."""
    max_snapshots: int = 256
    """Kept env-state snapshots at most (``SessionManager.snapshot``; ``AtCapacity`` beyond). They expire after
    ``session_ttl_s`` unused, as sessions do."""
    client_max_sessions: int | None = None
    """Live sessions one client (``Session.owner``) holds at most (``QuotaExceeded`` beyond, HTTP 503
    ``quota_exceeded`` naming it); ``None``: its fair share, ``max_sessions`` over the number of clients (at least
    1), so no client can take what another needs."""
    client_max_snapshots: int | None = None
    """Kept snapshots one client holds at most (``QuotaExceeded``); ``None``: ``max_snapshots`` over the number of
    clients."""
    client_max_new_tasks: int | None = None
    """Tasks one client's resets may generate (an env that makes tasks on demand, TextWorld: :mod:`envs.generation`)
    within ``new_tasks_window_s`` (``QuotaExceeded`` naming it, before anything is generated; resets of generated
    tasks go on); ``None``: no bound (in-process callers; the HTTP server's default is 256). Concurrent resets may
    each generate one past it."""
    new_tasks_window_s: float = 3600.0
    """The sliding window of ``client_max_new_tasks`` (seconds)."""
    client_max_workers: int | None = None
    """Worker processes one client holds at most, by sessions or snapshots (a snapshot keeps its worker); beyond,
    its sessions share its own workers (``max_sessions_per_worker``), else ``QuotaExceeded``; ``None``: the workers
    over the number of clients (at least 1)."""
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
    refused_env_kwargs: tuple[str, ...] = ()
    """Env kwargs a session may not be opened with (``EnvRejected``, HTTP 422 naming them): the server refuses
    host paths (``envs.data.PATH_KWARGS``) from its clients; in-process callers are trusted (none)."""
    refused_options: tuple[str, ...] = ()
    """Reset options a session may not be opened or reset with (``EnvRejected``, HTTP 422 naming them): the server
    refuses host paths (``envs.data.PATH_OPTIONS``) from its clients; in-process callers are trusted (none)."""

    _kind = "session settings"
    _rules = "max_sessions, max_sessions_per_worker >= 1; workers, prestart_workers >= 0; ttl, env_timeout > 0"

    def invalid(self) -> list[str]:
        """``name=value`` of every setting the manager could not run with."""
        return [f"{name}={getattr(self, name)!r}" for name, ok in [
            ("max_sessions", self.max_sessions is None or self.max_sessions >= 1),
            ("workers", self.workers is None or self.workers >= 0),
            ("max_sessions_per_worker", self.max_sessions_per_worker >= 1),
            ("max_snapshots", self.max_snapshots >= 0),
            ("client_max_sessions", self.client_max_sessions is None or self.client_max_sessions >= 1),
            ("client_max_snapshots", self.client_max_snapshots is None or self.client_max_snapshots >= 0),
            ("client_max_workers", self.client_max_workers is None or self.client_max_workers >= 1),
            ("client_max_new_tasks", self.client_max_new_tasks is None or self.client_max_new_tasks >= 0),
            ("new_tasks_window_s", self.new_tasks_window_s > 0),
            ("session_ttl_s", self.session_ttl_s is None or self.session_ttl_s > 0),
            ("prestart_workers", self.prestart_workers >= 0),
            ("env_timeout_s", self.env_timeout_s is None or self.env_timeout_s > 0)] if not ok]

    def client_count(self) -> int:
        """Clients the quotas share the pools among (the HTTP server's clients; here: one)."""
        return 1

    def client_quota(self, name: str) -> int | None:
        """The per-client quota ``client_<name>`` (``max_sessions``, ``max_snapshots``, ``max_workers``): as set,
        else the pool's size over :meth:`client_count` (at least 1; ``None``: the pool has no size)."""
        quota = getattr(self, f"client_{name}")
        if quota is not None:
            return quota
        total = {"max_sessions": self.max_sessions, "max_snapshots": self.max_snapshots,
                 "max_workers": self.workers or self.max_sessions}[name]
        return None if total is None else max(1, total // self.client_count())

    def __post_init__(self) -> None:
        """Raises ValueError on a setting the manager could not run with (before any worker starts)."""
        bad = self.invalid()
        if bad:
            raise ValueError(f"invalid {self._kind}: {', '.join(bad)} ({self._rules})")


def _refuse_host_paths(what: str, given: dict[str, Any] | None, refused: tuple[str, ...], hint: str = "") -> None:
    """``EnvRejected`` (HTTP 422) naming the keys of ``given`` (a client's env kwargs or reset options) that are in
    ``refused`` (host paths: where the data lives is the server's choice)."""
    names = sorted(set(given or {}) & set(refused))
    if names:
        raise EnvRejected(f"{what} {', '.join(names)} name host paths, which the server chooses, not the client "
                          f"(refused here: {', '.join(refused)}{hint})")


class EnvBackend(Protocol):
    """What :class:`SessionManager` needs of a pool of envs (``WorkerPool`` and ``ThreadEnvPool`` have it)."""

    async def prestart(self, n: int) -> None: ...
    async def open(self, session_id: str, env_id: str, *, env_kwargs: dict[str, Any] | None = None,
                   seed: int | None = None, options: dict[str, Any] | None = None, owner: str | None = None,
                   may_generate: bool = True) -> tuple[Any, dict[str, Any]]: ...
    async def reset(self, session_id: str, *, seed: int | None = None, options: dict[str, Any] | None = None,
                    may_generate: bool = True) -> tuple[Any, dict[str, Any]]: ...
    async def step(self, session_id: str, action: Any) -> StepReply: ...
    async def info(self, session_id: str, what: str, params: Any = None) -> Any: ...
    async def snapshot(self, session_id: str, snapshot_id: str) -> None: ...
    async def restore(self, session_id: str, snapshot_id: str, *, owner: str | None = None
                      ) -> tuple[Any, Any]: ...
    async def drop_snapshot(self, snapshot_id: str) -> None: ...
    def broken_snapshots(self) -> list[str]: ...
    async def close(self, session_id: str) -> None: ...
    async def reap(self) -> None: ...
    def broken_sessions(self) -> list[str]: ...
    def stats(self) -> dict[str, Any]: ...
    async def aclose(self) -> None: ...


@dataclass
class Session:
    """One live env session."""

    session_id: str
    env_id: str
    created_at: float = field(default_factory=time.time)
    last_used: float = field(default_factory=time.monotonic)
    steps: int = 0
    episodes: int = 1
    done: bool = False
    busy: bool = False
    owner: str | None = None
    """The client that opened it (the HTTP server's client name; ``None``: the server's own, or no clients)."""


@dataclass
class Snapshot:
    """One kept env state (:meth:`SessionManager.snapshot`); the state itself stays where the env lives."""

    snapshot_id: str
    env_id: str
    owner: str | None = None
    """The client whose session it was taken of (only that client may restore or drop it)."""
    steps: int = 0
    """Steps of the source episode when it was taken."""
    last_used: float = field(default_factory=time.monotonic)


class SessionManager:
    """Live sessions over a pool of envs, with capacity, TTL and per-session exclusivity.

    Args:
        settings: limits and worker settings.
        pool: where the envs live; default: a :class:`WorkerPool` built from ``settings`` (one process per live
            session up to ``settings.workers``).
    """

    def __init__(self, settings: SessionSettings, pool: EnvBackend | None = None) -> None:
        self.settings = settings
        if pool is None:
            preload = [m for e in settings.env_ids or [] for m in env_module(e)]
            pool = WorkerPool(
                settings.workers or settings.max_sessions or 64,
                max_sessions_per_worker=settings.max_sessions_per_worker,
                imports=settings.imports,
                preload=preload,
                max_resets_per_worker=settings.max_resets_per_worker,
                max_worker_rss_mb=settings.max_worker_rss_mb,
                timeout_s=settings.env_timeout_s,
                reset_nice=settings.reset_nice,
                max_workers_per_owner=settings.client_quota("max_workers"),
            )
        self.pool: Any = pool
        self.sessions: dict[str, Session] = {}
        self.snapshots: dict[str, Snapshot] = {}
        self._background: set[asyncio.Future[None]] = set()  # drops of failed snapshots still running
        self._new_tasks: dict[str | None, collections.deque[float]] = {}  # owner -> when its resets generated one
        self._new_tasks_in_flight: dict[str | None, int] = {}  # owner -> its resets in flight that may generate one
        self._reaper: asyncio.Task[None] | None = None
        self.expired = 0

    async def start(self) -> None:
        """Start the first workers, check that every env can serve, start the TTL reaper (if there is a TTL).

        Raises:
            EnvNotReady: a served env failed to make/reset with its defaults (``check_envs``); every worker is
                ended first.
        """
        await self.pool.prestart(self.settings.prestart_workers)
        if self.settings.check_envs:
            for env_id in self.settings.env_ids or []:
                probe = f"startup-check-{uuid.uuid4().hex}"
                try:
                    await self.pool.open(probe, env_id)
                except EnvFailed as exc:
                    await self.pool.aclose()
                    raise EnvNotReady(f"env {env_id} cannot serve, refusing to start: {exc}") from None
                await self.pool.close(probe)
        if self.settings.session_ttl_s is not None:
            self._reaper = asyncio.create_task(self._reap_forever())

    async def aclose(self) -> None:
        """Graceful shutdown: stop the reaper, close every env, end every worker."""
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
        self.sessions.clear()
        self.snapshots.clear()
        await self.pool.aclose()

    async def _reap_forever(self) -> None:
        assert self.settings.session_ttl_s is not None
        interval = max(0.05, min(self.settings.session_ttl_s / 4, 10.0))
        while True:
            await asyncio.sleep(interval)
            try:
                await self.reap()
            except Exception:  # noqa: BLE001 (one failed pass must not end expiry for good: the next one retries)
                log.exception("session reaper pass failed")

    async def reap(self) -> None:
        """Close sessions idle longer than the TTL, drop broken ones, end long-idle workers."""
        now = time.monotonic()
        ttl = self.settings.session_ttl_s
        expired = [s.session_id for s in self.sessions.values()
                   if ttl is not None and not s.busy and now - s.last_used > ttl]
        for session_id in expired + self.pool.broken_sessions():
            if self.sessions.pop(session_id, None) is not None:
                self.expired += session_id in expired
            await self.pool.close(session_id)
        gone = [k for k, snap in self.snapshots.items() if ttl is not None and now - snap.last_used > ttl]
        for snapshot_id in gone + self.pool.broken_snapshots():
            if self.snapshots.pop(snapshot_id, None) is not None:  # a client may drop it meanwhile: not an error
                await self.pool.drop_snapshot(snapshot_id)
        await self.pool.reap()

    # ---- helpers ---------------------------------------------------------------------------------------------
    def get(self, session_id: str) -> Session:
        """The live session, or ``SessionNotFound``."""
        try:
            return self.sessions[session_id]
        except KeyError:
            raise SessionNotFound(session_id) from None

    @contextlib.asynccontextmanager
    async def _exclusive(self, session_id: str, *, keep_rejected: bool = False) -> AsyncIterator[Session]:
        """Hold the session for one request: 409 (``SessionBusy``) if another request holds it; on an env
        failure the session is closed (the env's state is unknown) and ``EnvFailed`` propagates. ``keep_rejected``:
        a rejected request (``EnvRejected``: the episode was not touched) leaves the session open."""
        session = self.get(session_id)
        if session.busy:
            raise SessionBusy(f"session {session_id} is busy with another request")
        session.busy = True
        try:
            yield session
        except EnvFailed as exc:
            if not (keep_rejected and isinstance(exc, EnvRejected)):
                self.sessions.pop(session_id, None)
                await self.pool.close(session_id)
            raise
        finally:
            session.busy = False
            session.last_used = time.monotonic()

    def _check_quota(self, name: str, owner: str | None, held: Any, what: str) -> None:
        """``QuotaExceeded`` naming ``client_<name>`` when ``owner`` holds that many of ``held`` (sessions or
        snapshots, each with an ``owner``)."""
        quota = self.settings.client_quota(name)
        if quota is None:
            return
        mine = sum(1 for item in held if item.owner == owner)
        if mine >= quota:
            raise QuotaExceeded(f"client {owner!r} holds {mine} {what} (client_{name}={quota}); free some or "
                                "retry later")

    # ---- operations ------------------------------------------------------------------------------------------
    async def create(
        self,
        env_id: str,
        *,
        seed: int | None = None,
        options: dict[str, Any] | None = None,
        env_kwargs: dict[str, Any] | None = None,
        session_id: str | None = None,
        owner: str | None = None,
    ) -> tuple[str, Any, dict[str, Any]]:
        """Open a session: ``gymnasium.make`` + ``reset`` in a worker -> ``(session_id, observation, info)``.

        ``session_id``: the client's choice (default: a new uuid4 hex), so a client that lost the answer can still
        close the session. ``owner``: the client it belongs to (``Session.owner``; the server checks it,
        ``servers.access.ClientSessions``). Raises ``UnknownEnv`` (404), ``SessionExists`` (409), ``AtCapacity`` (503;
        ``QuotaExceeded``: the owner's ``client_max_sessions``), ``EnvFailed`` (500/504), ``InvalidText`` (422: a
        lone surrogate in any of the arguments).
        """
        _check_text(env_id=env_id, session_id=session_id, options=options, env_kwargs=env_kwargs)
        _refuse_host_paths("env_kwargs", env_kwargs, self.settings.refused_env_kwargs)
        _refuse_host_paths("reset options", options, self.settings.refused_options,
                           "; select a game by task_id, split and index")
        if env_id not in (gymnasium.registry if self.settings.env_ids is None else self.settings.env_ids):
            served = "any registered id" if self.settings.env_ids is None else self.settings.env_ids
            raise UnknownEnv(f"env id {env_id!r} is not served here; served: {served}")
        may_generate = self._reserve_new_task(owner)
        try:
            opened = await self._open(Session(session_id or "", env_id, busy=True, owner=owner),
                                      lambda sid: self.pool.open(sid, env_id, env_kwargs=env_kwargs, seed=seed,
                                                                 options=options, owner=owner,
                                                                 may_generate=may_generate))
        finally:
            self._settle_new_task(owner, may_generate)
        self._count_generated(owner, opened[2])
        return opened

    def _reserve_new_task(self, owner: str | None) -> bool:
        """Whether ``owner``'s next reset may generate a new task (``client_max_new_tasks`` in the window,
        counting its resets in flight that may generate one): when it may, that reset holds one of the quota's
        places until :meth:`_settle_new_task`, so concurrent resets never generate past the quota."""
        quota = self.settings.client_max_new_tasks
        if quota is None:
            return True
        times = self._new_tasks.get(owner)
        horizon = time.monotonic() - self.settings.new_tasks_window_s
        while times and times[0] < horizon:
            times.popleft()
        if len(times or ()) + self._new_tasks_in_flight.get(owner, 0) >= quota:
            return False
        self._new_tasks_in_flight[owner] = self._new_tasks_in_flight.get(owner, 0) + 1
        return True

    def _settle_new_task(self, owner: str | None, reserved: bool) -> None:
        """The reset that reserved a place (:meth:`_reserve_new_task`) ended: free the place (a task it generated
        is counted by :meth:`_count_generated`)."""
        if reserved and self.settings.client_max_new_tasks is not None:
            left = self._new_tasks_in_flight.pop(owner, 1) - 1
            if left > 0:
                self._new_tasks_in_flight[owner] = left

    def _count_generated(self, owner: str | None, info: Any) -> None:
        if isinstance(info, dict) and info.get("task_generated"):
            self._new_tasks.setdefault(owner, collections.deque()).append(time.monotonic())

    async def _open(self, session: Session, opener: Callable[[str], Awaitable[tuple[Any, Any]]]
                    ) -> tuple[str, Any, dict[str, Any]]:
        """Book ``session`` (its id ``""``: a new uuid4 hex) and run ``opener(session_id)`` in the pool ->
        ``(session_id, observation, info)``; ``SessionExists``/``AtCapacity`` before, nothing booked after a failure."""
        if session.session_id and session.session_id in self.sessions:
            raise SessionExists(f"a live session has the id {session.session_id!r}")
        if self.settings.max_sessions is not None and len(self.sessions) >= self.settings.max_sessions:
            raise AtCapacity(f"{len(self.sessions)} live sessions (max_sessions={self.settings.max_sessions})")
        self._check_quota("max_sessions", session.owner, self.sessions.values(), "live sessions")
        session.session_id = session.session_id or uuid.uuid4().hex
        self.sessions[session.session_id] = session
        try:
            observation, info = await opener(session.session_id)
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
        _check_text(options=options)
        _refuse_host_paths("reset options", options, self.settings.refused_options,
                           "; select a game by task_id, split and index")
        async with self._exclusive(session_id) as session:
            may_generate = self._reserve_new_task(session.owner)
            try:
                observation, info = await self.pool.reset(session_id, seed=seed, options=options,
                                                          may_generate=may_generate)
            finally:
                self._settle_new_task(session.owner, may_generate)
            session.done = False
            session.episodes += 1
        self._count_generated(session.owner, info)
        return observation, info

    async def step(self, session_id: str, action: Any) -> StepReply:
        """Step an open session. Raises ``SessionNotFound`` (404), ``EpisodeOver``/``SessionBusy`` (409),
        ``EnvFailed`` (500/504; the session is then closed), ``InvalidText`` (422: the action is not valid Unicode;
        the episode goes on as if it had not been sent)."""
        _check_text(action=action)
        session = self.get(session_id)
        if session.done:
            raise EpisodeOver(f"episode of session {session_id} is over (terminated or truncated); reset it")
        async with self._exclusive(session_id) as session:
            reply = await self.pool.step(session_id, action)
            session.steps += 1
            session.done = reply.terminated or reply.truncated
        return reply

    async def info(self, session_id: str, what: str, params: Any = None) -> Any:
        """What the env of an open session declares, its episode untouched: ``info(sid, "tools")`` -> its tools
        (OpenAI-style function schemas, ``[]`` when none); ``info(sid, "tasks")`` -> ``[{"name", "type",
        "num_tasks"}]`` per split, ``info(sid, "tasks", {"split", "start", "stop"})`` -> task specs; ``None`` when
        the env has no task listing (:mod:`envs.hosting.task_listing`).

        Raises ``SessionNotFound`` (404), ``SessionBusy`` (409), ``EnvRejected`` (422: a bad split or range; the
        session stays open), ``EnvFailed`` (500/504: the env or its worker failed; the session is closed)."""
        async with self._exclusive(session_id, keep_rejected=True):
            return await self.pool.info(session_id, what, params)

    # ---- snapshots: forked groups by state copy (envs.hosting.child, "Snapshots") ------------------------------
    async def snapshot(self, session_id: str) -> str:
        """Keep the open session's env state (the env's ``clone_state()``, kept where the env lives; its episode
        goes on untouched) -> a new snapshot id (a uuid4 hex), owned by the session's owner.

        Raises ``SessionNotFound`` (404), ``EpisodeOver`` (409: nothing left to continue), ``SessionBusy`` (409),
        ``AtCapacity`` (503: ``max_snapshots`` kept; ``QuotaExceeded``: the owner's ``client_max_snapshots``),
        ``EnvRejected``
        (422: the env has no ``clone_state``/``set_state``; the session stays open), ``EnvFailed`` (500/504: the
        session is closed)."""
        session = self.get(session_id)
        if session.done:
            raise EpisodeOver(f"episode of session {session_id} is over; a snapshot of it has nothing to continue")
        if len(self.snapshots) >= self.settings.max_snapshots:
            raise AtCapacity(f"{len(self.snapshots)} kept snapshots (max_snapshots={self.settings.max_snapshots})")
        self._check_quota("max_snapshots", session.owner, self.snapshots.values(), "kept snapshots")
        snap = Snapshot(uuid.uuid4().hex, session.env_id, owner=session.owner, steps=session.steps)
        self.snapshots[snap.snapshot_id] = snap  # booked first: a concurrent request cannot exceed the limit
        try:
            async with self._exclusive(session_id, keep_rejected=True):
                await self.pool.snapshot(session_id, snap.snapshot_id)
        except BaseException:  # failed or cancelled: the env side may still keep it (a cancelled call runs on)
            self.snapshots.pop(snap.snapshot_id, None)
            drop = asyncio.ensure_future(self.pool.drop_snapshot(snap.snapshot_id))  # after the snapshot call
            self._background.add(drop)
            drop.add_done_callback(self._background.discard)
            raise
        return snap.snapshot_id

    async def restore(self, snapshot_id: str, *, session_id: str | None = None, owner: str | None = None
                      ) -> tuple[str, Any, dict[str, Any]]:
        """Open a new session in the state of a kept snapshot (a fresh env of the same id and kwargs, reset as the
        source was, then ``set_state``) -> ``(session_id, observation, info)``, the source's last observation and
        info; the snapshot stays kept (restore it again, or drop it). ``owner``: the new session's owner.

        Raises ``SnapshotNotFound`` (404), ``SessionExists`` (409), ``AtCapacity`` (503), ``EnvFailed`` (500/504:
        no session is open)."""
        _check_text(snapshot_id=snapshot_id, session_id=session_id)
        snap = self.get_snapshot(snapshot_id)
        snap.last_used = time.monotonic()
        session = Session(session_id or "", snap.env_id, busy=True, owner=owner, steps=snap.steps)
        try:
            return await self._open(session, lambda sid: self.pool.restore(sid, snapshot_id, owner=owner))
        except KeyError:  # the pool no longer holds it (its worker ended)
            self.snapshots.pop(snapshot_id, None)
            raise SnapshotNotFound(snapshot_id) from None

    def get_snapshot(self, snapshot_id: str) -> Snapshot:
        """The kept snapshot, or ``SnapshotNotFound``."""
        try:
            return self.snapshots[snapshot_id]
        except KeyError:
            raise SnapshotNotFound(snapshot_id) from None

    async def drop_snapshot(self, snapshot_id: str) -> None:
        """Free a kept snapshot (404 ``SnapshotNotFound`` if unknown)."""
        self.get_snapshot(snapshot_id)
        self.snapshots.pop(snapshot_id, None)
        await self.pool.drop_snapshot(snapshot_id)

    async def close(self, session_id: str) -> None:
        """Close a session and free its env (404 if unknown)."""
        self.get(session_id)
        self.sessions.pop(session_id, None)
        await self.pool.close(session_id)


def _check_text(**fields: Any) -> None:
    """``InvalidText`` naming the first field (and where in it) that holds a lone UTF-16 surrogate, or that is
    nested deeper than :data:`envs.jsondepth.MAX_JSON_DEPTH`: text that is not Unicode never reaches an env, and
    neither does a value that would raise ``RecursionError`` on its way (pickling to the worker; the HTTP server
    refuses both the same way before parsing the body)."""
    for name, value in fields.items():
        if value_depth(value) > MAX_JSON_DEPTH:
            raise InvalidText(f"{name} nested deeper than {MAX_JSON_DEPTH} levels")
        found = lone_surrogate(value, name)
        if found:
            raise InvalidText(found)
