"""The env pool as the rollout calls it: every call bounded by ``rollout.env_timeout_s`` and failing as
:class:`EnvCallFailed`, its time summed, and env resets started early (:meth:`EnvSessions.prefetch`) kept until an
episode takes them.

Failures: an env call that raises or times out (after the client's own retries) fails the episode attempt; the group
player re-runs it (``rollout.episode_retries``) and drops a group whose episode still fails. That includes an env that
could not judge (``envs.errors.EnvInfraError``: HTTP 500 ``env_infra_error``, ``EnvServerError`` in-process), which
is never a reward (``docs/env_errors.md``), and a reward a batch cannot hold (NaN, inf, beyond float32:
:func:`checked_reward`).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Awaitable, Callable, Sequence, TypeVar

from agent_rl.types import Task
from envs.numbers import RewardError
from envs.numbers import checked_reward as _checked_reward

T = TypeVar("T")


class EnvCallFailed(RuntimeError):
    """An env call (reset/step) raised or ran past ``rollout.env_timeout_s``, or gave a reward a batch cannot hold
    (:func:`checked_reward`)."""


def checked_reward(value: Any, source: str) -> float:
    """:func:`envs.numbers.checked_reward` for the rollout: a reward that breaks the rule (NaN, inf, beyond float32)
    fails the episode attempt (:class:`EnvCallFailed`: re-run, then the group dropped), never reaches a batch."""
    try:
        return _checked_reward(value, source)
    except RewardError as exc:
        raise EnvCallFailed(str(exc)) from None


class EnvSessions:
    """Env calls of one group player's episodes on ``pool`` (``agent_rl.envclient``: HTTP or in-process, it never
    knows which; None: no env, the standalone gateway's), each bounded by ``timeout_s`` seconds.

    Attributes:
        env_s: seconds spent in env calls since the run's start (summed over concurrent episodes; the player
            zeroes it).
        prefetched_tasks: tasks whose resets :meth:`prefetch` started and no run has taken yet.
    """

    def __init__(self, pool: Any, timeout_s: float) -> None:
        self.pool, self.timeout_s = pool, timeout_s
        self.env_s = 0.0
        self.prefetched_tasks: list[Task] = []
        self._prefetched: dict[tuple[int, int], asyncio.Future] = {}  # (group_id, slot) -> reset in flight

    async def call(self, make_call: Callable[[], Awaitable[T]]) -> T:
        """Await ``make_call()`` within the timeout; any failure raises :class:`EnvCallFailed`."""
        t0 = time.perf_counter()
        try:
            return await asyncio.wait_for(make_call(), self.timeout_s)
        except Exception as exc:  # noqa: BLE001 (any env-side failure: client error, timeout, broken server)
            raise EnvCallFailed(f"{type(exc).__name__}: {exc}") from exc
        finally:
            self.env_s += time.perf_counter() - t0

    async def reset(self, task: Task) -> Any:
        """A new session of ``task`` (its env id, seed, options and env kwargs)."""
        return await self.call(lambda: self.pool.reset(task.env_id, seed=task.seed, options=task.options,
                                                       env_kwargs=task.env_kwargs))

    def take_prefetched(self, task: Task, slot: int) -> asyncio.Future | None:
        """The prefetched reset of ``slot`` of ``task``'s group (None: none); it is no longer kept here."""
        return self._prefetched.pop((task.group_id, slot), None)

    async def open(self, early: asyncio.Future | None, task: Task) -> Any:
        """The session of an episode: the prefetched reset ``early`` (:meth:`take_prefetched`), else a new one."""
        return await early if early is not None else await self.reset(task)

    async def close(self, session_id: str) -> None:
        """Close a session, best effort (the server's TTL reaps leftovers)."""
        try:
            await asyncio.wait_for(self.pool.close(session_id), 30.0)
        except Exception:  # noqa: BLE001 (closing is best effort)
            pass

    # ------------------------------------------------------------------ prefetch
    def prefetch(self, tasks: Sequence[Task], episodes_per_task: int) -> None:
        """Start the env resets of the next step's episodes now (the trainer calls this before the learner update,
        which it runs in a worker thread): ALFWorld resets cost seconds, and this hides them behind the update."""
        self.prefetched_tasks = list(tasks)
        for task in tasks:
            for slot in range(episodes_per_task):
                self._prefetched[(task.group_id, slot)] = asyncio.ensure_future(self.reset(task))

    def take_tasks(self, n: int) -> list[Task]:
        """Up to ``n`` prefetched tasks, first drawn first (they are played next)."""
        tasks, self.prefetched_tasks = self.prefetched_tasks[:n], self.prefetched_tasks[n:]
        return tasks

    async def release(self, group_ids: set[int]) -> None:
        """Close the prefetched sessions of ``group_ids`` that no episode took: a group that played fewer than its
        G slots as plain episodes (forks under ``rollout.fork.budget=episodes|turns`` play 1..G bases and fill
        the rest only as far as the budget goes) left them open, holding the env's capacity."""
        stale = [key for key in self._prefetched if key[0] in group_ids]
        await self._close_resets([self._prefetched.pop(key) for key in stale], cancel=False)

    async def aclose(self) -> None:
        """Cancel prefetched resets and close their sessions."""
        futures, self._prefetched, self.prefetched_tasks = list(self._prefetched.values()), {}, []
        await self._close_resets(futures)

    async def _close_resets(self, futures: list[asyncio.Future], cancel: bool = True) -> None:
        """Close the sessions of reset futures (cancelled first with ``cancel``; best effort)."""
        if cancel:
            for fut in futures:
                fut.cancel()
        for fut in futures:
            try:
                reset = await fut
                await asyncio.wait_for(self.pool.close(reset.session_id), 30.0)
            except BaseException:  # noqa: BLE001 (cancelled or failed: nothing to close)
                pass
