"""Worker processes that own the environments (no web framework here: the app and ``LocalEnvPool`` share it).

Why processes: an ALFWorld reset costs 2-5 CPU-seconds of pure Python (PDDL -> SAS translation), a step 60-180 ms.
Run in the server process (even in threads, because of the GIL) one reset would stall every other session's step,
which is exactly the peer's failure (AgentGym: step p99 25.7 s at 32 sessions). So every env lives in a worker
process and the event loop only waits on pipes.

Placement (measured in ``benchmarks/bench_env_server.py``):

* A session whose task key (env id + env kwargs + reset options) was recently opened by a live worker goes to that
  worker if every session it holds plays that same task (and it holds fewer than ``max_sessions_per_worker``), so a
  group of episodes of the same game pays the game load once (the env caches loaded games per process), and no
  session ever waits behind another task's reset.
* Otherwise it goes to an idle worker (no sessions; its process and caches are reused), else a new worker is started
  (up to ``max_workers``), else to the least-loaded worker. With ``max_workers >= max_sessions`` (the default) that
  means one process per live session, so a reset never stalls another session's steps; the OS shares the cores.
* Workers are started from a ``forkserver`` that has already imported gymnasium, ``envs`` and the served envs'
  entry-point modules, so a new worker costs a ``fork`` (tens of ms); heavy env code (textworld, fast-downward) is
  imported by each worker itself (see :func:`env_module`), once per worker, which is then reused across sessions.
* A closed session's env is kept by its worker (one per env id + kwargs) and reused by the next session with the
  same env id and kwargs (see :func:`_worker_main` for why this matters for ALFWorld).
* Memory stays flat: kept envs are bounded; a really closed env is followed by ``gc.collect()`` (after replying); a
  worker that has served ``max_resets_per_worker`` resets, or whose RSS exceeds ``max_worker_rss_mb``, is ended when
  it next becomes idle; at most ``max_idle_workers`` idle workers are kept, each for at most ``idle_worker_ttl_s``.

Protocol over a ``multiprocessing`` pipe, one request at a time per worker (an ``asyncio.Lock``; the reply is read
by an event-loop reader on the pipe, so no thread sits between the loop and a worker):
``(op, session_id, args)`` -> ``(status, payload, detail, rss)``. A pool is bound to the event loop it first runs on.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import importlib
import json
import math
import multiprocessing
import os
import signal
import time
import traceback
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

__all__ = [
    "AtCapacity",
    "EnvFailed",
    "EnvInfraFailed",
    "EnvRejected",
    "EnvTimeout",
    "StepReply",
    "WorkerPool",
    "env_module",
    "task_key",
    "to_jsonable",
]

_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


class EnvFailed(RuntimeError):
    """The env raised, its worker died, or it did not answer in time. The session is then unusable."""


class EnvRejected(EnvFailed):
    """``make``/``reset`` raised ValueError, LookupError (KeyError, IndexError), TypeError or
    ``gymnasium.error.Error``: the request's env kwargs, seed or options are invalid (a client error, HTTP 422).
    The session is not usable either way."""


class EnvInfraFailed(EnvFailed):
    """The env raised :class:`envs.errors.EnvInfraError`: it could not judge (sandbox, verifier, game engine
    failure), which is never a reward. HTTP 500 with code ``env_infra_error``; the orchestrator retries, then drops
    the group (``docs/env_errors.md``)."""


class EnvTimeout(EnvFailed):
    """The env did not answer within the timeout; its worker was killed."""


class AtCapacity(RuntimeError):
    """No worker can take another session right now (retry later)."""


@dataclass
class StepReply:
    """One ``env.step`` result, JSON-ready."""

    observation: Any
    reward: float
    terminated: bool
    truncated: bool
    info: dict[str, Any]


def to_jsonable(value: Any) -> Any:
    """Convert an env's observation/info to plain JSON types (str, int, float, bool, None, list, dict).

    numpy scalars and arrays become Python numbers and lists (gymnasium's episode-statistics wrapper puts numpy
    floats in ``info``), tuples/sets become lists, bytes are decoded as UTF-8 (with replacement), non-finite floats
    become ``None`` (JSON has no NaN), and anything else becomes ``str(value)``.
    """
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [to_jsonable(v) for v in value]
    if hasattr(value, "dtype") and hasattr(value, "tolist"):  # numpy scalar or array
        return to_jsonable(value.tolist())
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", errors="replace")
    return str(value)


def task_key(env_id: str, env_kwargs: dict[str, Any] | None, options: dict[str, Any] | None) -> str | None:
    """Key of the task a reset loads: ``None`` when the options select nothing (a seeded random task).

    Two sessions with the same key load the same game, so they are routed to a worker that has it cached.
    """
    if not options:
        return None
    return json.dumps([env_id, env_kwargs or {}, options], sort_keys=True, default=str)


def env_module(env_id: str) -> list[str]:
    """Modules the forkserver imports before forking workers for a registered env: the module of its string entry
    point (``"envs.alfworld:ALFWorldEnv"`` -> ``["envs.alfworld"]``); ``[]`` for a callable entry point.

    Deliberately not the module the entry point resolves to (``envs.alfworld.env``, which imports textworld and
    loads fast-downward): the forkserver stays a small plain process, and each worker imports the heavy env code
    itself, once (workers are reused across sessions). Preloading it would make new workers start faster; it was
    tried while ALFWorld workers were segfaulting (a fault later traced to creating and closing envs over and over,
    see :func:`_worker_main`) and is left off until measured safe.
    """
    import gymnasium

    entry_point = gymnasium.spec(env_id).entry_point
    return [entry_point.split(":")[0]] if isinstance(entry_point, str) else []


def _rss_bytes() -> int:
    """Resident set size of this process in bytes (Linux ``/proc``; 0 elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * _PAGE_SIZE
    except (OSError, ValueError, IndexError):
        return 0


def can_renice() -> bool:
    """Whether this process may raise its priority again after lowering it (``CAP_SYS_NICE``: root, or a container
    started with ``cap_add: [SYS_NICE]``)."""
    try:
        with open("/proc/self/status") as f:
            caps = next(line for line in f if line.startswith("CapEff:"))
        return bool(int(caps.split()[1], 16) & (1 << 23))  # CAP_SYS_NICE
    except (OSError, StopIteration, ValueError, IndexError):
        return False


def _worker_main(conn: Any, imports: Sequence[str], reset_nice: int = 0, keep_envs: int = 1) -> None:
    """Body of a worker process: own the envs of its sessions and answer one request at a time until EOF.

    A closed session's env is kept (up to ``keep_envs`` per env id + kwargs) and handed to the next session that
    asks for the same env id and kwargs; that session's ``reset`` starts a fresh episode (the gymnasium contract).
    This saves ``gymnasium.make`` and keeps the env's per-instance resources: ALFWorld's env loads a private copy
    of fast-downward's library per instance, and creating/closing instances over and over in one process made
    workers segfault inside ``libdownward.so`` (about 1 in 50 new-env resets); reused instances never did.

    With ``reset_nice > 0`` (and ``CAP_SYS_NICE``) the process runs ``make``/``reset`` at that lower priority and
    steps at its normal one: a reset burns seconds of CPU, and the OS then gives the cores to the other sessions'
    steps first (a step is what an agent waits on; resets of other sessions must not slow it down).
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C goes to the server, which shuts workers down in order
    base_nice = os.getpriority(os.PRIO_PROCESS, 0)
    lower = reset_nice > 0 and can_renice()

    @contextlib.contextmanager
    def low_priority() -> Iterator[None]:
        if not lower:
            yield
            return
        os.setpriority(os.PRIO_PROCESS, 0, min(19, base_nice + reset_nice))
        try:
            yield
        finally:
            os.setpriority(os.PRIO_PROCESS, 0, base_nice)

    import gymnasium

    import envs  # noqa: F401  (registers the built-in ids)
    from envs.errors import EnvInfraError
    from envs.wrappers import make_env

    for name in imports:
        importlib.import_module(name)
    sessions: dict[str, gymnasium.Env] = {}
    made_with: dict[str, str] = {}  # session id -> env key (env id + kwargs)
    kept: dict[str, list[gymnasium.Env]] = {}  # env key -> envs of closed sessions, ready for reuse

    def close(session_id: str, *, keep: bool = True) -> bool:
        """Close a session; keep its env for reuse if there is room. True if an env was really closed."""
        env = sessions.pop(session_id, None)
        key = made_with.pop(session_id, None)
        if env is None:
            return False
        if keep and key is not None and len(kept.setdefault(key, [])) < keep_envs:
            kept[key].append(env)
            return False
        env.close()
        return True

    while True:
        collect = False
        try:
            op, session_id, args = conn.recv()
        except (EOFError, OSError, KeyboardInterrupt):
            break
        try:
            if op == "open":
                env_id, env_kwargs, seed, options = args
                close(session_id)
                key = json.dumps([env_id, env_kwargs or {}], sort_keys=True, default=str)
                with low_priority():
                    reused = kept.get(key)
                    sessions[session_id] = reused.pop() if reused else make_env(env_id, **(env_kwargs or {}))
                    made_with[session_id] = key
                    try:
                        observation, info = sessions[session_id].reset(seed=seed, options=options)
                    except BaseException:
                        close(session_id, keep=False)  # its state is unknown: do not hand it to another session
                        raise
                payload: Any = (to_jsonable(observation), to_jsonable(info))
            elif op == "reset":
                seed, options = args
                with low_priority():
                    try:
                        observation, info = sessions[session_id].reset(seed=seed, options=options)
                    except BaseException:
                        made_with.pop(session_id, None)  # an env that raised is closed, never handed on
                        raise
                payload = (to_jsonable(observation), to_jsonable(info))
            elif op == "step":
                try:
                    observation, reward, terminated, truncated, info = sessions[session_id].step(args)
                except BaseException:
                    made_with.pop(session_id, None)  # an env that raised is closed, never handed on
                    raise
                payload = (to_jsonable(observation), float(reward), bool(terminated), bool(truncated),
                           to_jsonable(info))
            elif op == "close":
                collect = close(session_id)
                payload = None
            elif op == "ping":
                payload = len(sessions)
            elif op == "shutdown":
                for sid in list(sessions):
                    close(sid, keep=False)
                for env in [e for envs_ in kept.values() for e in envs_]:
                    env.close()
                kept.clear()
                conn.send(("ok", None, "", _rss_bytes()))
                break
            else:
                raise ValueError(f"unknown op {op!r}")
            reply = ("ok", payload, "", _rss_bytes())
        except Exception as exc:  # the env raised: report it, keep serving the other sessions of this worker
            # make/reset rejecting the client's kwargs/seed/options is the client's error, not the env's
            rejected = op in ("open", "reset") and isinstance(exc, (ValueError, LookupError, TypeError,
                                                                     gymnasium.error.Error))
            status = "infra" if isinstance(exc, EnvInfraError) else "rejected" if rejected else "error"
            reply = (status, f"{type(exc).__name__}: {exc}",
                     traceback.format_exc(limit=20), _rss_bytes())
        try:
            conn.send(reply)
        except (BrokenPipeError, OSError):
            break
        if collect:  # after the reply: textworld games hold reference cycles; free them now, off the request path
            gc.collect()
    conn.close()


class _Worker:
    """Parent-side handle of one worker process.

    One request at a time per worker (an ``asyncio.Lock``), so the worker is always waiting in ``recv`` when a
    request is sent and a send never blocks the event loop; the reply is read by an event-loop reader on the pipe
    (no thread hop). The exchange runs in its own task, so a cancelled caller never desynchronises the pipe: the
    reply is still consumed before the next request is sent.
    """

    def __init__(self, index: int, ctx: Any, imports: Sequence[str], reset_nice: int = 0, keep_envs: int = 1) -> None:
        self.index = index
        self.sessions: dict[str, str | None] = {}  # session id -> its task key
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
        self.process = ctx.Process(target=_worker_main, args=(child_conn, tuple(imports), reset_nice, keep_envs),
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
        ``EnvTimeout`` (after killing the worker) if it did not answer within ``timeout_s``."""
        if not self.alive:
            raise EnvFailed(f"env worker {self.index} is gone")
        exchange = asyncio.ensure_future(self._exchange((op, session_id, args)))
        exchange.add_done_callback(lambda t: t.cancelled() or t.exception())  # retrieved even if nobody waits
        try:
            status, payload, detail, rss = await asyncio.wait_for(asyncio.shield(exchange), timeout_s)
        except asyncio.TimeoutError:
            self.kill()
            raise EnvTimeout(f"env did not answer {op!r} within {timeout_s} s; its worker was ended") from None
        self.rss = rss
        if status == "rejected":
            raise EnvRejected(payload)
        if status == "infra":
            raise EnvInfraFailed(payload)
        if status != "ok":
            raise EnvFailed(payload)
        return payload

    def kill(self) -> None:
        """End the process now (no goodbye); a pending request fails with ``EnvFailed``."""
        if self.process is not None and self.process.is_alive():
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


class WorkerPool:
    """Sessions of gymnasium envs placed on worker processes (see the module docstring for the policy).

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
        methods = multiprocessing.get_all_start_methods()
        method = start_method or ("forkserver" if "forkserver" in methods else "spawn")
        self._ctx = multiprocessing.get_context(method)
        if method == "forkserver":
            modules = ["gymnasium", "envs", "servers.workers", *preload, *self.imports]
            self._ctx.set_forkserver_preload(list(dict.fromkeys(modules)))
        self._workers: list[_Worker] = []
        self._by_session: dict[str, _Worker] = {}
        self._made_with: dict[str, tuple[str, dict[str, Any] | None]] = {}  # session id -> (env id, env kwargs)
        self._next_index = 0
        self.started_workers = 0

    # ---- placement -------------------------------------------------------------------------------------------
    def _new_worker(self) -> _Worker:
        worker = _Worker(self._next_index, self._ctx, self.imports, self.reset_nice, self.keep_envs)
        self._next_index += 1
        self.started_workers += 1
        self._workers.append(worker)
        return worker

    def _place(self, key: str | None) -> _Worker:
        alive = [w for w in self._workers if w.alive]
        if key is not None:
            # Only join a worker whose live sessions all play this same task (a group): joining one that runs
            # another task would queue this session's requests behind that task's (possibly slow) resets.
            hits = [w for w in alive if key in w.keys and len(w.sessions) < self.max_sessions_per_worker
                    and all(k == key for k in w.sessions.values())]
            if hits:
                return min(hits, key=lambda w: len(w.sessions))
        idle = [w for w in alive if not w.sessions]
        if idle:
            return max(idle, key=lambda w: w.idle_since)  # the most recently used: warmest caches
        if len(alive) < self.max_workers:
            return self._new_worker()
        open_slots = [w for w in alive if len(w.sessions) < self.max_sessions_per_worker]
        if not open_slots:
            raise AtCapacity(f"all {len(alive)} workers hold {self.max_sessions_per_worker} sessions")
        return min(open_slots, key=lambda w: len(w.sessions))

    def _remember(self, worker: _Worker, key: str | None) -> None:
        if key is None:
            return
        worker.keys[key] = None
        worker.keys.move_to_end(key)
        while len(worker.keys) > self.keys_per_worker:
            worker.keys.popitem(last=False)

    def _worker_of(self, session_id: str) -> _Worker:
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
    ) -> tuple[Any, dict[str, Any]]:
        """``gymnasium.make(env_id, **env_kwargs)`` then ``reset(seed, options)`` in a worker.

        Returns ``(observation, info)``. Raises ``AtCapacity`` or ``EnvFailed`` (the session is then not open).
        """
        key = task_key(env_id, env_kwargs, options)
        worker = self._place(key)
        worker.sessions[session_id] = key
        self._by_session[session_id] = worker
        self._made_with[session_id] = (env_id, env_kwargs)
        self._remember(worker, key)
        worker.resets += 1
        try:
            observation, info = await worker.call("open", session_id, (env_id, env_kwargs, seed, options),
                                                  self.timeout_s)
        except BaseException:  # includes cancellation: the worker may still create the env, so close it there
            await self._release(session_id, send_close=True)
            raise
        return observation, info

    async def reset(
        self, session_id: str, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        """``env.reset(seed=seed, options=options)`` of an open session -> ``(observation, info)``."""
        worker = self._worker_of(session_id)
        worker.resets += 1
        key = task_key(*self._made_with[session_id], options)
        worker.sessions[session_id] = key
        self._remember(worker, key)
        observation, info = await worker.call("reset", session_id, (seed, options), self.timeout_s)
        return observation, info

    async def step(self, session_id: str, action: Any) -> StepReply:
        """``env.step(action)`` of an open session."""
        worker = self._worker_of(session_id)
        observation, reward, terminated, truncated, info = await worker.call("step", session_id, action,
                                                                             self.timeout_s)
        return StepReply(observation, reward, terminated, truncated, info)

    async def close(self, session_id: str) -> None:
        """Close the session's env (idempotent); recycle its worker if it is due."""
        await self._release(session_id, send_close=True)

    async def _release(self, session_id: str, *, send_close: bool) -> None:
        worker = self._by_session.pop(session_id, None)
        self._made_with.pop(session_id, None)
        if worker is None:
            return
        worker.sessions.pop(session_id, None)
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
        await asyncio.gather(*(w.stop() for w in workers), return_exceptions=True)
