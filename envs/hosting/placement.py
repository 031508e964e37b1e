"""Which worker gets a new session (measured in ``benchmarks/bench_env_server.py``).

* A session whose task key (env id + env kwargs + reset options, :func:`task_key`) was recently opened by a live
  worker goes to that worker if every session it holds plays that same task (and it holds fewer than
  ``max_sessions_per_worker``), so a group of episodes of the same game pays the game load once (the env caches
  loaded games per process), and no session ever waits behind another task's reset.
* Otherwise it goes to an idle worker (no sessions; its process and caches are reused), else a new worker is started
  (up to ``max_workers``), else to the least-loaded worker. With ``max_workers >= max_sessions`` (the default) that
  means one process per live session, so a reset never stalls another session's steps; the OS shares the cores.

Pure functions over :class:`Placed` (what the policy reads of a worker), so the policy is testable without processes.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

from envs.hosting.errors import AtCapacity

__all__ = ["Placed", "place", "remember", "task_key"]


class Placed(Protocol):
    """What placement reads of a worker."""

    alive: bool
    sessions: dict[str, str | None]  # session id -> its task key
    keys: OrderedDict[str, None]  # task keys recently opened here (LRU)
    idle_since: float


W = TypeVar("W", bound=Placed)


def task_key(env_id: str, env_kwargs: dict[str, Any] | None, options: dict[str, Any] | None) -> str | None:
    """Key of the task a reset loads: ``None`` when the options select nothing (a seeded random task).

    Two sessions with the same key load the same game, so they are routed to a worker that has it cached.
    """
    if not options:
        return None
    return json.dumps([env_id, env_kwargs or {}, options], sort_keys=True, default=str)


def place(workers: Sequence[W], key: str | None, *, max_workers: int, max_sessions_per_worker: int,
          new_worker: Callable[[], W]) -> W:
    """The worker for a new session with task ``key`` (see the module docstring); ``new_worker()`` starts one.

    Raises:
        AtCapacity: ``max_workers`` are alive and each holds ``max_sessions_per_worker`` sessions.
    """
    alive = [w for w in workers if w.alive]
    if key is not None:
        # Only join a worker whose live sessions all play this same task (a group): joining one that runs
        # another task would queue this session's requests behind that task's (possibly slow) resets.
        hits = [w for w in alive if key in w.keys and len(w.sessions) < max_sessions_per_worker
                and all(k == key for k in w.sessions.values())]
        if hits:
            return min(hits, key=lambda w: len(w.sessions))
    idle = [w for w in alive if not w.sessions]
    if idle:
        return max(idle, key=lambda w: w.idle_since)  # the most recently used: warmest caches
    if len(alive) < max_workers:
        return new_worker()
    open_slots = [w for w in alive if len(w.sessions) < max_sessions_per_worker]
    if not open_slots:
        raise AtCapacity(f"all {len(alive)} workers hold {max_sessions_per_worker} sessions")
    return min(open_slots, key=lambda w: len(w.sessions))


def remember(worker: Placed, key: str | None, keys_per_worker: int) -> None:
    """Record that ``worker`` opened task ``key`` (LRU of ``keys_per_worker`` keys)."""
    if key is None:
        return
    worker.keys[key] = None
    worker.keys.move_to_end(key)
    while len(worker.keys) > keys_per_worker:
        worker.keys.popitem(last=False)
