"""Which worker gets a new session (measured in ``benchmarks/bench_env_server.py``).

A worker answers one request at a time, so two sessions on one worker queue behind each other: a slow step of one
holds the other's step until it ends (measured: 1.8 s behind a 2 s step). Sessions therefore share a worker only
where the env gains from it, and never across clients:

* **Sharing is the env's choice.** An env whose class declares ``metadata["worker_cache"] = True`` caches loaded
  tasks per process (ALFWorld: a game's PDDL -> SAS translation, 2-5 CPU-s, reused by every later reset of that
  game in the process). Only for such envs has a session a task key (env id + env kwargs + reset options + owner,
  :func:`task_key`); a session whose key a live worker recently opened goes to that worker if every session it
  holds plays that same task of that same owner (and it holds fewer than ``max_sessions_per_worker``), so a group
  of episodes of one game pays the game load once, and no session ever waits behind another task's reset or another
  client's step. Every other env (Code-v0, Math, a user's env that declares nothing) has no key: its sessions are
  never placed together by choice, so a slow step of one never holds another's.
* Otherwise it goes to an idle worker (no sessions; its process and caches are reused), else a new worker is started
  (up to ``max_workers``), else, when ``max_workers`` is below the live sessions (the operator's ``--workers``), to
  the least-loaded worker whose sessions all belong to the same owner: a client may slow only its own sessions;
  when there is none, ``AtCapacity`` (503). With ``max_workers >= max_sessions`` (the default) that means one
  process per live session (one per group for ``worker_cache`` envs), so a step or reset never stalls another
  session's; the OS shares the cores.

Pure functions over :class:`Placed` (what the policy reads of a worker), so the policy is testable without processes.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

from envs.hosting.errors import AtCapacity, QuotaExceeded

__all__ = ["Placed", "place", "remember", "task_key"]


class Placed(Protocol):
    """What placement reads of a worker."""

    alive: bool
    sessions: dict[str, str | None]  # session id -> its task key
    owners: dict[str, str | None]  # session id -> the client that opened it
    keys: OrderedDict[str, None]  # task keys recently opened here (LRU)
    idle_since: float


W = TypeVar("W", bound=Placed)


def task_key(env_id: str, env_kwargs: dict[str, Any] | None, options: dict[str, Any] | None,
             owner: str | None = None, *, worker_cache: bool = True) -> str | None:
    """Key of the task a reset loads for ``owner``: ``None`` when the options select nothing (a seeded random task)
    or the env does not declare a per-process cache (``worker_cache=False``: its sessions are never grouped).

    Two sessions with the same key (same task, same client) are routed to a worker that has the task cached.
    """
    if not options or not worker_cache:
        return None
    return json.dumps([env_id, env_kwargs or {}, options, owner], sort_keys=True, default=str)


def place(workers: Sequence[W], key: str | None, *, max_workers: int, max_sessions_per_worker: int,
          new_worker: Callable[[], W], owner: str | None = None, max_owner_workers: int | None = None) -> W:
    """The worker for a new session of ``owner`` with task ``key`` (see the module docstring); ``new_worker()``
    starts one. An owner that holds ``max_owner_workers`` workers (by sessions or snapshots) gets none more: its
    session shares one of its own workers.

    Raises:
        QuotaExceeded: ``owner`` holds ``max_owner_workers`` workers, none with a free slot.
        AtCapacity: ``max_workers`` are alive and none holds only ``owner``'s sessions with a free slot (of
            ``max_sessions_per_worker``).
    """
    alive = [w for w in workers if w.alive]
    held = [w for w in alive if w.owners and all(o == owner for o in w.owners.values())]
    if max_owner_workers is not None and len(held) >= max_owner_workers:
        own_slots = [w for w in held if len(w.sessions) < max_sessions_per_worker]
        if not own_slots:
            raise QuotaExceeded(f"client {owner!r} holds {len(held)} workers, each with {max_sessions_per_worker} "
                                f"sessions or snapshots (client_max_workers={max_owner_workers})")
        hits = [w for w in own_slots if key is not None and key in w.keys
                and all(k == key for k in w.sessions.values())]
        return min(hits or own_slots, key=lambda w: len(w.sessions))
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
    open_slots = [w for w in alive if len(w.sessions) < max_sessions_per_worker
                  and all(o == owner for o in w.owners.values())]
    if not open_slots:
        raise AtCapacity(f"all {len(alive)} workers hold {max_sessions_per_worker} sessions or another "
                         "client's sessions")
    return min(open_slots, key=lambda w: len(w.sessions))


def remember(worker: Placed, key: str | None, keys_per_worker: int) -> None:
    """Record that ``worker`` opened task ``key`` (LRU of ``keys_per_worker`` keys)."""
    if key is None:
        return
    worker.keys[key] = None
    worker.keys.move_to_end(key)
    while len(worker.keys) > keys_per_worker:
        worker.keys.popitem(last=False)
