"""The env-hosting core without HTTP: the placement policy on plain records, ``EnvHost`` (the ops a worker process
runs) in this process, and a ``WorkerHandle``'s env timeout around a slow or hung process start (one real worker)."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

import pytest

from envs.hosting.child import EnvHost, raise_for_status
from envs.hosting.errors import AtCapacity, EnvFailed, EnvRejected
from envs.hosting.placement import place, remember, task_key

CALC = "agent_rl/Calculator-v0"


@dataclass
class FakeWorker:
    name: str
    sessions: dict = field(default_factory=dict)
    owners: dict = field(default_factory=dict)
    keys: OrderedDict = field(default_factory=OrderedDict)
    alive: bool = True
    idle_since: float = 0.0


def test_placement_policy():
    key_a, key_b = task_key(CALC, None, {"index": 0}), task_key(CALC, None, {"index": 1})
    assert task_key(CALC, None, None) is None and key_a != key_b
    started: list[FakeWorker] = []

    def new() -> FakeWorker:
        started.append(FakeWorker(f"new{len(started)}"))
        return started[-1]

    group = FakeWorker("group", sessions={"s1": key_a}, keys=OrderedDict({key_a: None}))
    mixed = FakeWorker("mixed", sessions={"s2": key_a, "s3": key_b}, keys=OrderedDict({key_a: None}))
    idle_old, idle_new = FakeWorker("idle_old", idle_since=1.0), FakeWorker("idle_new", idle_since=2.0)
    dead = FakeWorker("dead", alive=False, keys=OrderedDict({key_b: None}))
    workers = [group, mixed, idle_old, idle_new, dead]
    kw = {"max_workers": 8, "max_sessions_per_worker": 2, "new_worker": new}
    assert place(workers, key_a, **kw) is group  # same task, every session of it plays that task
    assert place(workers, key_b, **kw) is idle_new  # no live worker holds only key_b: the warmest idle one
    group.sessions["s4"] = key_a  # full (2 sessions)
    assert place(workers, key_a, **kw) is idle_new
    busy = [group, mixed, FakeWorker("one", sessions={"s5": None})]
    assert place(busy, None, **kw).name == "new0" and len(started) == 1  # no idle worker, room for a new one
    assert place(busy, None, **{**kw, "max_workers": 3}).name == "one"  # least loaded with an open slot
    busy[2].sessions["s6"] = None
    with pytest.raises(AtCapacity):
        place(busy, None, **{**kw, "max_workers": 3})
    w = FakeWorker("lru")
    for k in ("a", "b", "c", "a"):
        remember(w, k, keys_per_worker=2)
    assert list(w.keys) == ["c", "a"]


def test_placement_groups_only_declared_caches_of_one_client():
    assert task_key(CALC, None, {"index": 0}, "alice", worker_cache=False) is None  # no cache: never grouped
    alice, bob = task_key(CALC, None, {"index": 0}, "alice"), task_key(CALC, None, {"index": 0}, "bob")
    assert alice != bob
    group = FakeWorker("group", sessions={"s1": alice}, owners={"s1": "alice"}, keys=OrderedDict({alice: None}))
    started: list[FakeWorker] = []

    def new() -> FakeWorker:
        started.append(FakeWorker(f"new{len(started)}"))
        return started[-1]

    kw = {"max_workers": 2, "max_sessions_per_worker": 4, "new_worker": new}
    assert place([group], alice, owner="alice", **kw) is group
    assert place([group], bob, owner="bob", **kw).name == "new0"  # bob's same task: never alice's worker
    full = {**kw, "max_workers": 1}  # the operator's --workers 1: a client shares only its own worker
    assert place([group], None, owner="alice", **full) is group
    with pytest.raises(AtCapacity, match="another client"):
        place([group], None, owner="bob", **full)


def test_env_host_ops_and_kept_envs():
    host = EnvHost(keep_envs=1)
    status, (observation, info), _ = host.handle("open", "s1", (CALC, None, 0, {"index": 0}))
    assert status == "ok" and observation.startswith("Tom saves 17 dollars")
    env = host.sessions["s1"]
    status, step, _ = host.handle("step", "s1", "answer[215]")
    assert status == "ok" and step[:4] == ("Correct!", 1.0, True, False) and isinstance(step[4], dict)
    host.handle("close", "s1", None)
    assert host.collect_due is False and host.kept  # kept for reuse, not closed
    host.handle("open", "s2", (CALC, None, 0, {"index": 0}))
    assert host.sessions["s2"] is env  # the kept env is handed to the next session with the same id + kwargs
    status, payload, detail = host.handle("teleport", "s2", None)
    assert status == "error" and payload == "ValueError: unknown op 'teleport'" and "Traceback" in detail
    with pytest.raises(EnvFailed):
        raise_for_status(status, payload)
    status, payload, _ = host.handle("open", "s3", (CALC, {"no_such_kwarg": 1}, 0, None))
    assert status == "rejected"
    with pytest.raises(EnvRejected):
        raise_for_status(status, payload)
    assert "s3" not in host.sessions  # a failed open leaves no session behind
    assert host.handle("ping", "", None) == ("ok", 1, "")
    assert host.handle("shutdown", "", None)[0] == "ok" and host.sessions == {} and host.kept == {}


def test_values_nested_too_deep_never_reach_an_env():
    """In-process callers too (``LocalEnvPool``'s manager): options or env kwargs 900 deep are ``InvalidText``
    (422 ``invalid_request``) before any env sees them, not a RecursionError while pickling to a worker."""
    import asyncio

    from envs.hosting import SessionManager, SessionSettings, ThreadEnvPool
    from envs.hosting.errors import InvalidText

    deep: list = []
    for _ in range(900):
        deep = [deep]

    async def main():
        manager = SessionManager(SessionSettings(env_ids=None, check_envs=False, prestart_workers=0),
                                 pool=ThreadEnvPool(1))
        await manager.start()
        try:
            for kwargs in ({"options": {"a": deep}}, {"env_kwargs": {"a": deep}}):
                try:
                    await manager.create("agent_rl/Calculator-v0", **kwargs)
                except InvalidText as exc:
                    assert "nested deeper than 64 levels" in str(exc)
                else:
                    raise AssertionError("accepted")
            assert manager.sessions == {}
        finally:
            await manager.aclose()

    asyncio.run(main())


class _GatedStart:
    """A :class:`~envs.hosting.handle.WorkerHandle` whose process starts only once ``go`` is set: a start slowed by a
    busy machine (set later) or hung (set only to clean up)."""

    @staticmethod
    def make(go):
        import multiprocessing

        from envs.hosting.handle import WorkerHandle

        class Gated(WorkerHandle):
            def _start(self, *args):
                go.wait(600)  # the ceiling only frees a test that never sets it
                super()._start(*args)

        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(["gymnasium", "envs", "envs.hosting.child"])  # as WorkerPool's forkserver
        return Gated(0, ctx, imports=())


def test_a_slow_worker_start_is_not_counted_as_the_envs_time():
    """The env timeout counts from when the worker's process runs: a start slower than the timeout (a busy
    machine launching the forkserver) is waited for, and the env's answer (``ping``, from a process forked with its
    modules loaded) is on time."""
    import asyncio
    import threading

    async def main():
        go = threading.Event()
        handle = _GatedStart.make(go)
        threading.Timer(3.0, go.set).start()  # the start takes > 3 s, past the env's timeout
        try:
            assert await handle.call("ping", "", None, timeout_s=2.0) == 0  # live sessions: none
        finally:
            go.set()
            await handle.stop()

    asyncio.run(main())


def test_a_hung_worker_start_is_still_caught(monkeypatch):
    """A start that never ends: after ``START_TIMEOUT_S`` the request's own timeout runs and ends it (EnvTimeout)."""
    import asyncio
    import threading

    from envs.hosting import handle as handle_module
    from envs.hosting.errors import EnvTimeout

    monkeypatch.setattr(handle_module, "START_TIMEOUT_S", 0.2)

    async def main():
        go = threading.Event()
        handle = _GatedStart.make(go)
        try:
            with pytest.raises(EnvTimeout, match="within 0.3 s"):
                await handle.call("ping", "", None, timeout_s=0.3)
            assert not handle.alive
        finally:
            go.set()  # lets the start end, so the process it makes is closed with the handle
            await handle.stop()

    asyncio.run(main())


def test_a_worker_reads_the_environment_of_its_start_not_of_the_forkserver(monkeypatch, tmp_path):
    """The forkserver starts once per process and froze its environment then: a worker forked from it ran with that
    old environment (a games folder or bound set since never reached the env; in the full suite a TextWorld test
    generated its games into the user's cache). Each worker now takes the environment of the moment it starts: the
    bound set after the forkserver started refuses the missing game, and nothing is generated."""
    import asyncio

    from envs.generation import TEXTWORLD_MAX_INDEX_ENV
    from envs.hosting.pool import WorkerPool

    async def main():
        first = WorkerPool(1, preload=["envs.textworld"])
        await first.prestart(1)  # the forkserver runs now (or ran before this test), with the old environment
        await first.aclose()
        monkeypatch.setenv("AGENT_RL_TEXTWORLD_GAMES", str(tmp_path))  # an empty games folder
        monkeypatch.setenv(TEXTWORLD_MAX_INDEX_ENV, "0")  # no game generated on demand
        pool = WorkerPool(1, preload=["envs.textworld"])
        try:
            with pytest.raises(EnvRejected, match="not generated on demand"):
                await pool.open("s", "agent_rl/TextWorld-v0", env_kwargs={"family": "coin_collector", "level": 1},
                                options={"split": "train", "index": 3})
        finally:
            await pool.aclose()

    asyncio.run(main())
    assert list(tmp_path.iterdir()) == []
