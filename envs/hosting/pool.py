"""Worker processes that own the environments (no web framework here: the HTTP server and ``LocalEnvPool`` share it).

Why processes: an ALFWorld reset costs 2-5 CPU-seconds of pure Python (PDDL -> SAS translation), a step 60-180 ms.
Run in the server process (even in threads, because of the GIL) one reset would stall every other session's step,
which is exactly the peer's failure (AgentGym: step p99 25.7 s at 32 sessions). So every env lives in a worker
process (:mod:`envs.hosting.child`) and the event loop only waits on pipes (:mod:`envs.hosting.handle`); which
worker gets a session is :mod:`envs.hosting.placement`.

* Workers are started from a ``forkserver`` that has already imported gymnasium, ``envs`` and the served envs'
  entry-point modules, so a new worker costs a ``fork`` (tens of ms); heavy env code (textworld, fast-downward) is
  imported by each worker itself (see :func:`env_module`), once per worker, which is then reused across sessions.
* A closed session's env is kept by its worker (one per env id + kwargs) and reused by the next session with the
  same env id and kwargs (see :mod:`envs.hosting.child` for why this matters for ALFWorld).
* Memory stays flat: kept envs are bounded; a really closed env is followed by ``gc.collect()`` (after replying); a
  worker that has served ``max_resets_per_worker`` resets, or whose RSS exceeds ``max_worker_rss_mb``, is ended when
  it next becomes idle; at most ``max_idle_workers`` idle workers are kept, each for at most ``idle_worker_ttl_s``.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from envs.hosting.errors import EnvFailed
from envs.hosting.handle import WorkerHandle
from envs.hosting.placement import place, remember, task_key

__all__ = ["StepReply", "WorkerPool", "env_module"]


@dataclass
class StepReply:
    """One ``env.step`` result, JSON-ready."""

    observation: Any
    reward: float
    terminated: bool
    truncated: bool
    info: dict[str, Any]


def env_module(env_id: str) -> list[str]:
    """Modules the forkserver imports before forking workers for a registered env: the module of its string entry
    point (``"envs.alfworld:ALFWorldEnv"`` -> ``["envs.alfworld"]``); ``[]`` for a callable entry point.

    Deliberately not the module the entry point resolves to (``envs.alfworld.env``, which imports textworld and
    loads fast-downward): the forkserver stays a small plain process, and each worker imports the heavy env code
    itself, once (workers are reused across sessions). Preloading it would make new workers start faster; it was
    tried while ALFWorld workers were segfaulting (a fault later traced to creating and closing envs over and over,
    see :mod:`envs.hosting.child`) and is left off until measured safe.
    """
    import gymnasium

    entry_point = gymnasium.spec(env_id).entry_point
    return [entry_point.split(":")[0]] if isinstance(entry_point, str) else []


class WorkerPool:
    """Sessions of gymnasium envs placed on worker processes (see :mod:`envs.hosting.placement` for the policy).

    Args:
        max_workers: most worker processes alive at once.
        max_sessions_per_worker: most sessions one worker holds (sessions beyond one per worker only happen when
            all ``max_workers`` are busy, or to share a cached game).
        imports: modules every worker imports first (a user's module that calls ``gymnasium.register``).
        preload: modules the forkserver imports once before forking workers (the served envs' modules).
        keys_per_worker: task keys remembered per worker (match the env's per-process game cache).
        max_resets_per_worker: a worker that served this many opens/resets is recycled when idle.
        max_worker_rss_mb: a worker above this RSS (MiB) is recycled when idle (``None``: no limit).
        max_idle_workers: idle workers kept warm (their caches reused); ``None``: ``max_workers``.
        idle_worker_ttl_s: an idle worker older than this is ended by :meth:`reap`.
        timeout_s: seconds one env call may take before its worker is killed (``None``: no limit).
        reset_nice: run ``make``/``reset`` this many nice levels lower than steps (0: off; needs ``CAP_SYS_NICE``,
            else ignored), so that resets yield the cores to other sessions' steps.
        keep_envs: envs of closed sessions each worker keeps per env id + kwargs for the next session (0: close
            every env with its session).
        start_method: ``"forkserver"`` (default where available) or ``"spawn"``.
        max_workers_per_owner: workers one owner (client) holds at most by its sessions and snapshots; beyond, its
            sessions share its own workers, else ``QuotaExceeded`` (``None``: no such bound).
    """

    def __init__(
        self,
        max_workers: int,
        *,
        max_sessions_per_worker: int = 8,
        imports: Iterable[str] = (),
        preload: Iterable[str] = (),
        keys_per_worker: int = 8,
        max_resets_per_worker: int = 500,
        max_worker_rss_mb: float | None = None,
        max_idle_workers: int | None = None,
        idle_worker_ttl_s: float = 600.0,
        timeout_s: float | None = 600.0,
        reset_nice: int = 10,
        keep_envs: int = 1,
        start_method: str | None = None,
        max_workers_per_owner: int | None = None,
    ) -> None:
        if max_workers < 1 or max_sessions_per_worker < 1:
            raise ValueError("max_workers and max_sessions_per_worker must be >= 1")
        self.max_workers = max_workers
        self.max_sessions_per_worker = max_sessions_per_worker
        self.imports = tuple(imports)
        self.keys_per_worker = keys_per_worker
        self.max_resets_per_worker = max_resets_per_worker
        self.max_worker_rss_mb = max_worker_rss_mb
        self.max_idle_workers = max_workers if max_idle_workers is None else max_idle_workers
        self.idle_worker_ttl_s = idle_worker_ttl_s
        self.timeout_s = timeout_s
        self.reset_nice = reset_nice
        self.keep_envs = keep_envs
        self.max_workers_per_owner = max_workers_per_owner
        methods = multiprocessing.get_all_start_methods()
        method = start_method or ("forkserver" if "forkserver" in methods else "spawn")
        self._ctx = multiprocessing.get_context(method)
        if method == "forkserver":
            modules = ["gymnasium", "envs", "envs.hosting.child", *preload, *self.imports]
            self._ctx.set_forkserver_preload(list(dict.fromkeys(modules)))
        self._workers: list[WorkerHandle] = []
        self._by_session: dict[str, WorkerHandle] = {}
        # session id -> (env id, env kwargs, owner)
        self._made_with: dict[str, tuple[str, dict[str, Any] | None, str | None]] = {}
        # snapshot id -> (the worker holding its state, its source session's made-with); a snapshot is booked in its
        # worker's ``sessions``/``owners`` under ``snapshot:<id>``: it keeps the worker (and its owner) as a session
        # does, so no other client's session shares that process and the worker is not recycled under it
        self._snapshots: dict[str, tuple[WorkerHandle, tuple[str, dict[str, Any] | None, str | None]]] = {}
        # env id -> whether its env declares a per-process task cache (``metadata["worker_cache"]``), learnt from
        # its first open (the server's start-up check opens every served env once); unknown: not shared
        self.worker_cache: dict[str, bool] = {}
        self._next_index = 0
        self.started_workers = 0

    # ---- placement -------------------------------------------------------------------------------------------
    def _new_worker(self) -> WorkerHandle:
        worker = WorkerHandle(self._next_index, self._ctx, self.imports, self.reset_nice, self.keep_envs)
        self._next_index += 1
        self.started_workers += 1
        self._workers.append(worker)
        return worker

    def _place(self, key: str | None, owner: str | None) -> WorkerHandle:
        return place(self._workers, key, max_workers=self.max_workers, owner=owner,
                     max_sessions_per_worker=self.max_sessions_per_worker, new_worker=self._new_worker,
                     max_owner_workers=self.max_workers_per_owner)

    def _key(self, env_id: str, env_kwargs: dict[str, Any] | None, owner: str | None,
             options: dict[str, Any] | None) -> str | None:
        return task_key(env_id, env_kwargs, options, owner, worker_cache=self.worker_cache.get(env_id, False))

    def _remember(self, worker: WorkerHandle, key: str | None) -> None:
        remember(worker, key, self.keys_per_worker)

    def _book(self, worker: WorkerHandle, session_id: str, key: str | None, owner: str | None,
              made_with: tuple[str, dict[str, Any] | None, str | None]) -> None:
        """Record a session opening on ``worker`` (its task key, owner, make arguments; one more reset)."""
        worker.sessions[session_id] = key
        worker.owners[session_id] = owner
        self._by_session[session_id] = worker
        self._made_with[session_id] = made_with
        worker.resets += 1

    def _worker_of(self, session_id: str) -> WorkerHandle:
        try:
            return self._by_session[session_id]
        except KeyError:
            raise KeyError(session_id) from None

    # ---- session operations ----------------------------------------------------------------------------------
    async def prestart(self, n: int) -> None:
        """Start ``n`` idle workers now (and the forkserver with them), so the first sessions do not wait."""
        workers = [self._new_worker() for _ in range(min(n, self.max_workers) - len(self._workers))]
        await asyncio.gather(*(w.call("ping", "", None, self.timeout_s) for w in workers))

    async def open(
        self,
        session_id: str,
        env_id: str,
        *,
        env_kwargs: dict[str, Any] | None = None,
        seed: int | None = None,
        options: dict[str, Any] | None = None,
        owner: str | None = None,
        may_generate: bool = True,
    ) -> tuple[Any, dict[str, Any]]:
        """``gymnasium.make(env_id, **env_kwargs)`` then ``reset(seed, options)`` in a worker, for client ``owner``
        (sessions of different owners never share a worker: :mod:`envs.hosting.placement`); ``may_generate``:
        whether the reset may generate a new task (:mod:`envs.generation`).

        Returns ``(observation, info)``. Raises ``AtCapacity`` or ``EnvFailed`` (the session is then not open).
        """
        key = self._key(env_id, env_kwargs, owner, options)
        worker = self._place(key, owner)
        self._book(worker, session_id, key, owner, (env_id, env_kwargs, owner))
        self._remember(worker, key)
        try:
            observation, info = await worker.call("open", session_id,
                                                  (env_id, env_kwargs, seed, options, may_generate), self.timeout_s)
            if env_id not in self.worker_cache:
                declared = await worker.call("info", session_id, ("worker_cache", None), self.timeout_s)
                self.worker_cache[env_id] = bool(declared)
                worker.sessions[session_id] = key = self._key(env_id, env_kwargs, owner, options)
                self._remember(worker, key)
        except BaseException:  # includes cancellation: the worker may still create the env, so close it there
            await self._release(session_id, send_close=True)
            raise
        return observation, info

    async def reset(
        self, session_id: str, *, seed: int | None = None, options: dict[str, Any] | None = None,
        may_generate: bool = True,
    ) -> tuple[Any, dict[str, Any]]:
        """``env.reset(seed=seed, options=options)`` of an open session -> ``(observation, info)``."""
        worker = self._worker_of(session_id)
        worker.resets += 1
        key = self._key(*self._made_with[session_id], options)
        worker.sessions[session_id] = key
        self._remember(worker, key)
        observation, info = await worker.call("reset", session_id, (seed, options, may_generate), self.timeout_s)
        return observation, info

    async def step(self, session_id: str, action: Any) -> StepReply:
        """``env.step(action)`` of an open session."""
        worker = self._worker_of(session_id)
        observation, reward, terminated, truncated, info = await worker.call("step", session_id, action,
                                                                             self.timeout_s)
        return StepReply(observation, reward, terminated, truncated, info)

    async def info(self, session_id: str, what: str, params: Any = None) -> Any:
        """What an open session's env declares (``"tools"``, ``"tasks"``: :meth:`envs.hosting.child.EnvHost.info`);
        its episode is not touched."""
        return await self._worker_of(session_id).call("info", session_id, (what, params), self.timeout_s)

    async def snapshot(self, session_id: str, snapshot_id: str) -> None:
        """Keep the open session's env state as ``snapshot_id`` in its worker (:meth:`EnvHost.snapshot`). Raises
        ``EnvRejected`` (the env has no ``clone_state``/``set_state``) or ``EnvFailed``."""
        worker = self._worker_of(session_id)
        booked = f"snapshot:{snapshot_id}"  # booked before the call: the session may be closed while it runs
        worker.sessions[booked], worker.owners[booked] = worker.sessions[session_id], worker.owners[session_id]
        self._snapshots[snapshot_id] = (worker, self._made_with[session_id])
        await worker.call("snapshot", session_id, snapshot_id, self.timeout_s)

    async def restore(self, session_id: str, snapshot_id: str, *, owner: str | None = None) -> tuple[Any, Any]:
        """Open ``session_id`` in the state of ``snapshot_id`` -> ``(observation, info)`` (the source's last). It
        opens on the snapshot's worker, where the state is, even beyond ``max_sessions_per_worker`` (the session
        manager's ``max_sessions`` still bounds it). Raises ``KeyError`` (unknown snapshot, or its worker ended:
        the state is gone, the snapshot forgotten), ``EnvFailed`` (the env failed)."""
        worker, made_with = self._snapshots[snapshot_id]
        if not worker.alive:
            await self.drop_snapshot(snapshot_id)
            raise KeyError(snapshot_id)
        self._book(worker, session_id, worker.sessions.get(f"snapshot:{snapshot_id}"), owner, made_with)
        try:
            observation, info = await worker.call("restore", session_id, snapshot_id, self.timeout_s)
        except BaseException:
            await self._release(session_id, send_close=True)
            raise
        return observation, info

    async def drop_snapshot(self, snapshot_id: str) -> None:
        """Free a snapshot (idempotent); recycle its worker if it is due."""
        worker, _ = self._snapshots.pop(snapshot_id, (None, None))
        if worker is None:
            return
        booked = f"snapshot:{snapshot_id}"
        worker.sessions.pop(booked, None)
        worker.owners.pop(booked, None)
        if worker.alive:
            try:
                await worker.call("drop_snapshot", "", snapshot_id, self.timeout_s)
            except EnvFailed:
                pass
        if not worker.sessions:
            worker.idle_since = time.monotonic()
            await self._recycle()

    def broken_snapshots(self) -> list[str]:
        """Snapshots whose worker died (their state is gone)."""
        return [k for k, (w, _) in self._snapshots.items() if not w.alive]

    async def close(self, session_id: str) -> None:
        """Close the session's env (idempotent); recycle its worker if it is due."""
        await self._release(session_id, send_close=True)

    async def _release(self, session_id: str, *, send_close: bool) -> None:
        worker = self._by_session.pop(session_id, None)
        self._made_with.pop(session_id, None)
        if worker is None:
            return
        worker.sessions.pop(session_id, None)
        worker.owners.pop(session_id, None)
        if send_close and worker.alive:
            try:
                await worker.call("close", session_id, None, self.timeout_s)
            except EnvFailed:
                pass
        if not worker.sessions:
            worker.idle_since = time.monotonic()
            await self._recycle()

    async def _recycle(self) -> None:
        """End dead, worn-out or surplus idle workers."""
        rss_limit = None if self.max_worker_rss_mb is None else self.max_worker_rss_mb * 2**20
        self._workers = [w for w in self._workers if w.alive or w.sessions]
        idle = sorted((w for w in self._workers if w.alive and not w.sessions), key=lambda w: w.idle_since)
        doomed = [w for w in idle if w.resets >= self.max_resets_per_worker or (rss_limit and w.rss > rss_limit)]
        keep = [w for w in idle if w not in doomed]
        doomed += keep[: max(0, len(keep) - self.max_idle_workers)]
        for worker in doomed:
            self._workers.remove(worker)
            await worker.stop()

    async def reap(self) -> None:
        """End idle workers unused for ``idle_worker_ttl_s`` and forget dead ones (call periodically)."""
        now = time.monotonic()
        for worker in [w for w in self._workers if not w.sessions]:
            if not worker.alive or now - worker.idle_since > self.idle_worker_ttl_s:
                self._workers.remove(worker)
                await worker.stop()

    def worker_of(self, session_id: str) -> int | None:
        """Index of the worker holding the session (``None`` if unknown)."""
        worker = self._by_session.get(session_id)
        return None if worker is None else worker.index

    def pid_of(self, session_id: str) -> int | None:
        """Process id of the worker holding the session (``None`` if unknown)."""
        worker = self._by_session.get(session_id)
        return None if worker is None else worker.pid

    def broken_sessions(self) -> list[str]:
        """Sessions whose worker died (they cannot be stepped any more)."""
        return [sid for sid, w in self._by_session.items() if not w.alive]

    def stats(self) -> dict[str, Any]:
        """Workers, sessions and memory: ``rss_mb`` sums the last RSS each worker reported (MiB)."""
        alive = [w for w in self._workers if w.alive]
        return {
            "workers": len(alive),
            "idle_workers": sum(1 for w in alive if not w.sessions),
            "started_workers": self.started_workers,
            "sessions": len(self._by_session),
            "worker_rss_mb": round(sum(w.rss for w in alive) / 2**20, 1),
            "worker_pids": [w.pid for w in alive],
        }

    async def aclose(self) -> None:
        """Close every env and end every worker."""
        workers, self._workers = self._workers, []
        self._by_session.clear()
        self._made_with.clear()
        self._snapshots.clear()
        await asyncio.gather(*(w.stop() for w in workers), return_exceptions=True)
