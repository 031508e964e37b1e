"""The env side of hosting: :class:`EnvHost` owns envs and answers one request (``op``) at a time, through a dict
of small handlers; :func:`worker_main` is the body of a worker process that serves an ``EnvHost`` over a pipe.

Protocol (one request at a time per worker): ``(op, session_id, args)`` -> ``(status, payload, detail, rss)``,
``status`` one of ``"ok"``, ``"error"`` (the env raised), ``"rejected"`` (``make``/``reset`` refused the request's
kwargs, seed or options), ``"infra"`` (the env could not judge, :class:`envs.errors.EnvInfraError`).
:func:`raise_for_status` turns a reply's status into the :mod:`envs.hosting.errors` exception.

Snapshots (forked groups by state copy, ``rollout.fork.restore=state``): ``"snapshot"`` keeps the state of an open
session's env (the unwrapped env's ``clone_state()``, an opaque object that never leaves this host) under a snapshot
id; ``"restore"`` opens a new session on a fresh env of the same id and kwargs, reset with the source session's seed
and options, then ``set_state(state)``; its step count (``TimeLimit``) is the source's at the snapshot, and it
answers the source's last observation and info. ``"drop_snapshot"`` frees one. An env without both methods is
``"rejected"`` (it can still be forked by replay, if it replays exactly).

Kept envs: a closed session's env is kept (up to ``keep_envs`` per env id + kwargs) and handed to the next session
that asks for the same env id and kwargs; that session's ``reset`` starts a fresh episode (the gymnasium
contract). This saves ``gymnasium.make`` and keeps the env's per-instance resources: ALFWorld's env loads a private
copy of fast-downward's library per instance, and creating/closing instances over and over in one process made
workers segfault inside ``libdownward.so`` (about 1 in 50 new-env resets); reused instances never did.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import json
import os
import signal
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import gymnasium

from envs.errors import EnvInfraError
from envs.generation import NewTaskRefused, generating
from envs.hosting.errors import EnvFailed, EnvInfraFailed, EnvRejected, QuotaExceeded
from envs.hosting.jsonable import scrub_text, to_jsonable
from envs.numbers import checked_reward
from envs.procgroup import kill_group, own_session

__all__ = ["EnvHost", "StateUnsupported", "can_renice", "raise_for_status", "rss_bytes", "worker_main"]

_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def rss_bytes() -> int:
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


class StateUnsupported(ValueError):
    """The env has no ``clone_state``/``set_state``: a snapshot of it is refused (``"rejected"``, HTTP 422)."""


def _with_generated(info: Any, count: int) -> Any:
    """``info`` with ``task_generated: True`` when the request generated a task (:mod:`envs.generation`)."""
    return {**info, "task_generated": True} if count and isinstance(info, dict) else info


def raise_for_status(status: str, payload: Any) -> Any:
    """The payload of an ``"ok"`` reply; else raises ``EnvRejected``, ``QuotaExceeded`` (``"quota"``: the request
    may not generate the new task it selects), ``EnvInfraFailed`` or ``EnvFailed`` (with the env's
    ``"Type: message"`` as the message)."""
    if status == "quota":
        raise QuotaExceeded(payload)
    if status == "rejected":
        raise EnvRejected(payload)
    if status == "infra":
        raise EnvInfraFailed(payload)
    if status != "ok":
        raise EnvFailed(payload)
    return payload


class EnvHost:
    """The envs of one worker process (or of the threads of ``ThreadEnvPool``), keyed by session id.

    Args:
        keep_envs: envs of closed sessions kept per env id + kwargs for the next session (0: close every env with
            its session).
        low_priority: context manager factory that ``make``/``reset`` run under (a worker lowers its nice level
            there, so resets yield the cores to other sessions' steps).
    """

    def __init__(self, keep_envs: int = 1,
                 low_priority: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext) -> None:
        import envs  # noqa: F401  (registers the built-in ids)

        self.keep_envs = keep_envs
        self.low_priority = low_priority
        self.sessions: dict[str, Any] = {}  # session id -> env
        self.made_with: dict[str, str] = {}  # session id -> env key (env id + kwargs)
        self.kept: dict[str, list[Any]] = {}  # env key -> envs of closed sessions, ready for reuse
        self.collect_due = False  # an env was really closed: the worker runs gc.collect() after replying
        # session id -> (env id, env kwargs, seed, options) of its last reset, its steps since, its last answer
        self.episode_of: dict[str, tuple[str, dict[str, Any] | None, int | None, dict[str, Any] | None]] = {}
        self.steps: dict[str, int] = {}
        self.last: dict[str, tuple[Any, Any]] = {}
        # snapshot id -> (env id, env kwargs, seed, options, steps, last answer, state)
        self.snapshots: dict[str, tuple[Any, ...]] = {}
        self.handlers: dict[str, Callable[[str, Any], Any]] = {
            "open": self.open, "reset": self.reset, "step": self.step, "close": self.close, "ping": self.ping,
            "shutdown": self.shutdown, "info": self.info, "snapshot": self.snapshot, "restore": self.restore,
            "drop_snapshot": self.drop_snapshot,
        }

    def handle(self, op: str, session_id: str, args: Any) -> tuple[str, Any, str]:
        """Run one request -> ``(status, payload, detail)``; an env exception becomes a non-``"ok"`` status (the
        other sessions of this host keep being served)."""
        try:
            handler = self.handlers.get(op)
            if handler is None:
                raise ValueError(f"unknown op {op!r}")
            return "ok", handler(session_id, args), ""
        except Exception as exc:
            # make/reset rejecting the client's kwargs/seed/options is the client's error, not the env's
            rejected = isinstance(exc, StateUnsupported) or op in ("open", "reset", "info") and isinstance(
                exc, (ValueError, LookupError, TypeError, gymnasium.error.Error))
            status = ("infra" if isinstance(exc, EnvInfraError) else "quota" if isinstance(exc, NewTaskRefused)
                      else "rejected" if rejected else "error")
            # an env's message is env text: valid Unicode for the JSON answer (docs/servers.md, "Text")
            return status, scrub_text(f"{type(exc).__name__}: {exc}"), scrub_text(traceback.format_exc(limit=20))

    # ---- handlers: (session_id, args) -> JSON-ready payload -------------------------------------------------
    def open(self, session_id: str, args: tuple[Any, ...]) -> tuple[Any, Any]:
        """``make_env(env_id, **env_kwargs)`` (or a kept env) then ``reset`` -> ``(observation, info)``. ``args``:
        ``(env_id, env_kwargs, seed, options[, may_generate])``: whether the reset may generate a new task
        (:mod:`envs.generation`; a generated one is reported as ``info["task_generated"]``)."""
        from envs.wrappers import make_env

        env_id, env_kwargs, seed, options = args[:4]
        self._close(session_id)
        key = json.dumps([env_id, env_kwargs or {}], sort_keys=True, default=str)
        with self.low_priority(), generating(args[4] if len(args) > 4 else True) as generated:
            reused = self.kept.get(key)
            self.sessions[session_id] = reused.pop() if reused else make_env(env_id, **(env_kwargs or {}))
            self.made_with[session_id] = key
            try:
                observation, info = self.sessions[session_id].reset(seed=seed, options=options)
            except BaseException:
                self._close(session_id, keep=False)  # its state is unknown: do not hand it to another session
                raise
        return self._started(session_id, (env_id, env_kwargs, seed, options), observation,
                             _with_generated(info, generated[0]))

    def _started(self, session_id: str, episode: tuple[str, dict[str, Any] | None, int | None,
                                                       dict[str, Any] | None],
                 observation: Any, info: Any) -> tuple[Any, Any]:
        """Record a session's new episode (what a snapshot of it needs) -> its JSON-ready answer."""
        answer = to_jsonable(observation), to_jsonable(info)
        self.episode_of[session_id], self.steps[session_id], self.last[session_id] = episode, 0, answer
        return answer

    def reset(self, session_id: str, args: tuple[Any, ...]) -> tuple[Any, Any]:
        """``env.reset(seed, options)`` of an open session -> ``(observation, info)``; ``args``: ``(seed,
        options[, may_generate])`` (as :meth:`open`)."""
        seed, options = args[:2]
        with self.low_priority(), generating(args[2] if len(args) > 2 else True) as generated:
            try:
                observation, info = self.sessions[session_id].reset(seed=seed, options=options)
            except NewTaskRefused:  # refused before the env did anything: the episode is as it was
                raise
            except BaseException:
                self.made_with.pop(session_id, None)  # an env that raised is closed, never handed on
                raise
        env_id, env_kwargs = self.episode_of[session_id][:2]
        return self._started(session_id, (env_id, env_kwargs, seed, options), observation,
                             _with_generated(info, generated[0]))

    def step(self, session_id: str, action: Any) -> tuple[Any, float, bool, bool, Any]:
        """``env.step(action)`` -> ``(observation, reward, terminated, truncated, info)``; a reward that breaks
        :func:`envs.numbers.checked_reward` (NaN, inf, beyond float32) fails the step like an env exception (the
        session's env is closed, status ``"error"``: HTTP 500, an env failure of the episode)."""
        try:
            observation, reward, terminated, truncated, info = self.sessions[session_id].step(action)
            reward = checked_reward(reward, "the env's reward")
        except BaseException:
            self.made_with.pop(session_id, None)  # an env that raised is closed, never handed on
            raise
        observation, info = to_jsonable(observation), to_jsonable(info)
        self.steps[session_id] = self.steps.get(session_id, 0) + 1
        self.last[session_id] = (observation, info)
        return observation, reward, bool(terminated), bool(truncated), info

    # ---- snapshots (module docstring) -----------------------------------------------------------------------
    @staticmethod
    def _state_api(env: Any) -> tuple[Callable[[], Any], Callable[[Any], None]]:
        """The unwrapped env's ``(clone_state, set_state)``, or :class:`StateUnsupported`."""
        inner = env.unwrapped
        clone, restore = getattr(inner, "clone_state", None), getattr(inner, "set_state", None)
        if not callable(clone) or not callable(restore):
            raise StateUnsupported(f"{type(inner).__name__} has no clone_state()/set_state(state): its state cannot "
                                   "be copied (fork it by replay: rollout.fork.restore=replay)")
        return clone, restore

    def snapshot(self, session_id: str, snapshot_id: str) -> None:
        """Keep the open session's current state as ``snapshot_id`` (``clone_state()``; its episode untouched)."""
        env = self.sessions[session_id]
        clone, _ = self._state_api(env)
        env_id, env_kwargs, seed, options = self.episode_of[session_id]
        self.snapshots[snapshot_id] = (env_id, env_kwargs, seed, options, self.steps[session_id],
                                       self.last[session_id], clone())

    def restore(self, session_id: str, snapshot_id: str) -> tuple[Any, Any]:
        """Open ``session_id`` in the state of ``snapshot_id`` -> the source's last ``(observation, info)``."""
        from envs.wrappers import EpisodeOverGuard

        env_id, env_kwargs, seed, options, steps, last, state = self.snapshots[snapshot_id]
        self.open(session_id, (env_id, env_kwargs, seed, options))
        env = self.sessions[session_id]
        try:
            self._state_api(env)[1](state)
            wrapper = env
            while isinstance(wrapper, gymnasium.Wrapper):  # the step budget carries on from the source's count
                if isinstance(wrapper, gymnasium.wrappers.TimeLimit):
                    wrapper._elapsed_steps = steps
                elif isinstance(wrapper, EpisodeOverGuard):
                    wrapper._steps = steps
                wrapper = wrapper.env
        except BaseException:
            self._close(session_id, keep=False)  # half-restored: never hand it on
            raise
        self.steps[session_id], self.last[session_id] = steps, last
        return last

    def drop_snapshot(self, session_id: str, snapshot_id: str) -> None:
        """Free a snapshot (idempotent)."""
        self.snapshots.pop(snapshot_id, None)

    def info(self, session_id: str, args: tuple[str, dict[str, Any] | None]) -> Any:
        """What an open session's env declares, without touching its episode: ``("tools", None)`` -> its tools
        (the ``tools`` attribute of the unwrapped env, OpenAI-style function schemas; ``[]`` when it declares none);
        ``("tasks", None)`` -> its splits and their sizes, ``("tasks", {"split", "start", "stop"})`` -> task specs
        (:mod:`envs.hosting.task_listing`); ``None`` for an env without a task listing; ``("worker_cache", None)`` ->
        whether the env declares ``metadata["worker_cache"]`` (a per-process task cache). A bad split or range is
        ``"rejected"``."""
        from envs.hosting import task_listing as tasks

        what, params = args
        env = self.sessions[session_id].unwrapped
        if what == "tools":
            declared = getattr(env, "tools", None) or []
            if not isinstance(declared, (list, tuple)) or not all(isinstance(t, dict) for t in declared):
                raise RuntimeError(f"{type(env).__name__}.tools must be a list of function schemas (dicts), "
                                f"got {type(declared).__name__}")
            return to_jsonable(list(declared))
        if what == "worker_cache":  # sessions of one task share a worker only for such envs (envs.hosting.placement)
            return bool(getattr(env, "metadata", {}).get("worker_cache", False))
        if what == "tasks":
            try:
                if params is None:
                    return to_jsonable(tasks.task_catalog(env))
                return to_jsonable(tasks.task_range(env, params["split"], int(params["start"]), int(params["stop"])))
            except tasks.NoTaskApi:
                return None
        raise ValueError(f"unknown info {what!r} (tools, tasks)")

    def close(self, session_id: str, args: Any = None) -> None:
        """Close a session (its env is kept for reuse if there is room)."""
        self.collect_due = self._close(session_id)

    def ping(self, session_id: str, args: Any = None) -> int:
        """Number of live sessions."""
        return len(self.sessions)

    def shutdown(self, session_id: str = "", args: Any = None) -> None:
        """Close every env, kept ones too."""
        for sid in list(self.sessions):
            self._close(sid, keep=False)
        for env in [e for envs_ in self.kept.values() for e in envs_]:
            env.close()
        self.kept.clear()
        self.snapshots.clear()

    def _close(self, session_id: str, *, keep: bool = True) -> bool:
        """Close a session; keep its env for reuse if there is room. True if an env was really closed."""
        env = self.sessions.pop(session_id, None)
        key = self.made_with.pop(session_id, None)
        self.episode_of.pop(session_id, None), self.steps.pop(session_id, None), self.last.pop(session_id, None)
        if env is None:
            return False
        if keep and key is not None and len(self.kept.setdefault(key, [])) < self.keep_envs:
            self.kept[key].append(env)
            return False
        env.close()
        return True


def worker_main(conn: Any, imports: Sequence[str], reset_nice: int = 0, keep_envs: int = 1,
                environ: Mapping[str, str] | None = None) -> None:
    """Body of a worker process: own the envs of its sessions (an :class:`EnvHost`) and answer one request at a
    time until EOF or ``"shutdown"``.

    ``environ``: the starting process's environment when it started this worker, which replaces the one inherited
    (a ``forkserver`` child inherits the forkserver's, frozen when that server first started).

    With ``reset_nice > 0`` (and ``CAP_SYS_NICE``) the process runs ``make``/``reset`` at that lower priority and
    steps at its normal one: a reset burns seconds of CPU, and the OS then gives the cores to the other sessions'
    steps first (a step is what an agent waits on; resets of other sessions must not slow it down).
    """
    if environ is not None:
        os.environ.clear()
        os.environ.update(environ)
    own_session()  # the pool ends the worker with its group: what its envs start goes with it
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

    host = EnvHost(keep_envs, low_priority)
    for name in imports:
        importlib.import_module(name)
    while True:
        try:
            op, session_id, args = conn.recv()
        except (EOFError, OSError, KeyboardInterrupt):
            break
        host.collect_due = False
        status, payload, detail = host.handle(op, session_id, args)
        try:
            conn.send((status, payload, detail, rss_bytes()))
        except (BrokenPipeError, OSError):
            break
        if op == "shutdown" and status == "ok":
            break
        if host.collect_due:  # after the reply: textworld games hold reference cycles; free them now
            gc.collect()
    conn.close()
    # what its envs started and left running: asked to end with the worker (the pool SIGKILLs the group after)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    kill_group(os.getpid(), signal.SIGTERM)
