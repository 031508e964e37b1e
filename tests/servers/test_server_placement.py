"""Sessions share a worker process only where the env declares a per-process cache, and never across clients: a
slow step of one session never holds another's (``envs.hosting.placement``). Real worker processes, the user's
Echo env (``"sleep:<s>"`` is a slow step)."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # user_env_module

from envs.hosting.pool import WorkerPool  # noqa: E402

OPTIONS = {"task": 7}  # the same reset options: the same task key


async def _race(pool: WorkerPool, slow: str, fast: str) -> list[str]:
    """Step ``slow`` with a 2 s sleep and, once it is running, ``fast`` with a plain action -> finishing order."""
    order: list[str] = []

    async def step(session_id: str, action: str) -> None:
        await pool.step(session_id, action)
        order.append(session_id)

    slow_task = asyncio.create_task(step(slow, "sleep:2"))
    await asyncio.sleep(0.3)  # the slow step is in its worker
    await step(fast, "hello")
    await slow_task
    return order


def _run(env_id: str, owners: tuple[str | None, str | None]) -> tuple[list[str], int | None, int | None]:
    async def main() -> tuple[list[str], int | None, int | None]:
        pool = WorkerPool(4, imports=["user_env_module"])
        try:
            await pool.open("probe", env_id)  # what the server's start-up check does: learns the env's declaration
            await pool.close("probe")
            await pool.open("a", env_id, options=OPTIONS, owner=owners[0])
            await pool.open("b", env_id, options=OPTIONS, owner=owners[1])
            order = await _race(pool, "a", "b")
            return order, pool.pid_of("a"), pool.pid_of("b")
        finally:
            await pool.aclose()

    return asyncio.run(main())


def test_sessions_of_an_env_without_a_cache_never_wait_behind_each_other():
    # the same client, the same env id, kwargs and options: today's grouping key, yet Echo declares no cache
    order, pid_a, pid_b = _run("user/Echo-v0", ("alice", "alice"))
    assert pid_a != pid_b
    assert order == ["b", "a"]  # b's step answered while a's 2 s step still ran


def test_sessions_of_different_clients_never_share_a_worker():
    order, pid_a, pid_b = _run("user/CachedEcho-v0", ("alice", "bob"))
    assert pid_a != pid_b
    assert order == ["b", "a"]


def test_one_clients_group_of_a_cached_env_shares_its_worker():
    # the kept behaviour (ALFWorld's game cache): one client's group of one task on one worker, so b waits for a
    order, pid_a, pid_b = _run("user/CachedEcho-v0", ("alice", "alice"))
    assert pid_a == pid_b
    assert order == ["a", "b"]


def test_at_capacity_a_client_joins_only_its_own_workers():
    async def main() -> None:
        from envs.hosting.errors import AtCapacity

        pool = WorkerPool(1, imports=["user_env_module"])
        try:
            await pool.open("a", "user/Echo-v0", owner="alice")
            await pool.open("a2", "user/Echo-v0", owner="alice")  # the operator's --workers 1: alice shares with alice
            assert pool.pid_of("a") == pool.pid_of("a2")
            try:
                await pool.open("b", "user/Echo-v0", owner="bob")
            except AtCapacity as exc:
                assert "another client" in str(exc)
            else:
                raise AssertionError("bob's session was placed on alice's worker")
            assert pool.pid_of("b") is None
        finally:
            await pool.aclose()

    asyncio.run(main())
