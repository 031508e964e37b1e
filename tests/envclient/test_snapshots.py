"""Env-state snapshots (forked groups by state copy, ``rollout.fork.restore=state``) on the three pools: a restored
session continues exactly as its source (observations, rewards, the ``TimeLimit`` count, the env's own random
stream), one snapshot starts many sessions, and every refusal is a clear error that loses nothing (an env without
``clone_state``/``set_state``: 422, the session open; after the episode ended: 409; past ``max_snapshots``: 503; a
dropped snapshot: 404). Over HTTP a snapshot is its client's: another client's restore and drop are 404."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "servers"))  # user_env_module, servers_helpers

from servers_helpers import make_app, serve_asgi  # noqa: E402
from user_env_module import DriftEnv  # noqa: E402
from waiting import wait_until_async  # noqa: E402

from agent_rl.envclient import (  # noqa: E402
    EnvClientError,
    EnvUnavailable,
    EpisodeOver,
    HTTPEnvPool,
    LocalEnvPool,
    SnapshotNotFound,
)
from envs.hosting import SessionManager  # noqa: E402

DRIFT, ECHO = "user/Drift-v0", "user/Echo-v0"
KINDS = ["thread", pytest.param("process", marks=pytest.mark.slow), pytest.param("http", marks=pytest.mark.slow)]


@contextlib.asynccontextmanager
async def open_pool(kind: str, **settings) -> AsyncIterator[tuple[object, SessionManager]]:
    if kind == "http":
        app = make_app([DRIFT, ECHO], **settings)
        async with serve_asgi(app):
            async with HTTPEnvPool("http://localhost", transport=httpx.ASGITransport(app=app), retries=0) as pool:
                yield pool, app.state.manager
    else:
        async with LocalEnvPool(max_workers=2, mode=kind, imports=["user_env_module"],
                                max_snapshots=settings.get("max_snapshots", 256)) as pool:
            yield pool, pool.manager


def noise(observation: str) -> str:
    return observation.split("noise ")[1]


@pytest.mark.parametrize("kind", KINDS)
def test_a_restored_session_continues_as_its_source(kind):
    async def main():
        async with open_pool(kind) as (pool, manager):
            r = await pool.reset(DRIFT, seed=0)
            first = await pool.step(r.session_id, "right")  # pos 1
            snap = await pool.snapshot(r.session_id)
            source = [await pool.step(r.session_id, a) for a in ("right", "left", "right", "right")]
            copies = [await pool.restore(snap) for _ in range(2)]  # one snapshot, two sessions
            for c in copies:
                assert (c.observation, c.info["pos"]) == (first.observation, 1)  # the source's last answer
                played = [await pool.step(c.session_id, a) for a in ("right", "left", "right", "right")]
                assert [(s.observation, s.reward, s.terminated) for s in played] == \
                    [(s.observation, s.reward, s.terminated) for s in source]
                assert played[-1].terminated and played[-1].info["pos"] == 3
            # the TimeLimit count carries on: 1 step before the snapshot, 5 after -> truncated at the 6th
            c = await pool.restore(snap)
            steps = [await pool.step(c.session_id, "left") for _ in range(5)]
            assert [s.truncated for s in steps] == [False] * 4 + [True]
            # the unseeded noise really is the env's own stream: a fresh episode draws other numbers
            fresh = await pool.reset(DRIFT, seed=0)
            assert noise(fresh.observation) != noise(r.observation)
            assert snap in manager.snapshots and manager.snapshots[snap].steps == 1
            await pool.drop_snapshot(snap)
            await pool.drop_snapshot(snap)  # idempotent
            assert not manager.snapshots
            with pytest.raises(SnapshotNotFound):
                await pool.restore(snap)

    asyncio.run(main())


@pytest.mark.parametrize("kind", KINDS)
def test_refusals_are_clear_and_lose_nothing(kind):
    async def main():
        async with open_pool(kind, max_snapshots=2) as (pool, manager):
            e = await pool.reset(ECHO)
            with pytest.raises(EnvClientError) as info:  # no clone_state/set_state: 422, the session stays open
                await pool.snapshot(e.session_id)
            assert info.value.code == "invalid_request" and "clone_state" in str(info.value)
            assert (await pool.step(e.session_id, "hi")).observation.startswith("echo")
            d = await pool.reset(DRIFT)
            kept = [await pool.snapshot(d.session_id) for _ in range(2)]
            with pytest.raises(EnvUnavailable):  # max_snapshots=2
                await pool.snapshot(d.session_id)
            assert sorted(manager.snapshots) == sorted(kept)
            await pool.drop_snapshot(kept[0])
            for a in ("right", "right", "right"):
                last = await pool.step(d.session_id, a)
            assert last.terminated
            with pytest.raises(EpisodeOver):  # nothing left to continue
                await pool.snapshot(d.session_id)
            assert list(manager.snapshots) == [kept[1]]

    asyncio.run(main())


def test_snapshots_expire_with_the_session_ttl():
    async def main():
        async with LocalEnvPool(max_workers=1, mode="thread", imports=["user_env_module"]) as pool:
            pool.manager.settings.session_ttl_s = 0.05
            d = await pool.reset(DRIFT)
            snap = await pool.snapshot(d.session_id)
            await asyncio.sleep(0.1)
            await pool.manager.reap()
            assert not pool.manager.snapshots and not pool.manager.pool._host.snapshots
            with pytest.raises(SnapshotNotFound):
                await pool.restore(snap)

    asyncio.run(main())


@pytest.mark.slow
def test_a_snapshot_is_its_clients_only():
    tokens = {"alice": "tok-alice-5b1e", "bob": "tok-bob-77c2"}

    def auth(name):
        return {"Authorization": f"Bearer {tokens[name]}"}

    async def main():
        app = make_app([DRIFT], tokens=tokens)
        async with serve_asgi(app) as client:
            r = await client.post("/sessions", json={"env_id": DRIFT}, headers=auth("alice"))
            sid = r.json()["session_id"]
            r = await client.post(f"/sessions/{sid}/snapshot", headers=auth("bob"))  # not bob's session
            assert (r.status_code, r.json()["code"]) == (404, "session_not_found")
            r = await client.post(f"/sessions/{sid}/snapshot", headers=auth("alice"))
            assert r.status_code == 201, r.text
            snap = r.json()["snapshot_id"]
            for method, path in [("POST", f"/snapshots/{snap}/restore"), ("DELETE", f"/snapshots/{snap}")]:
                r = await client.request(method, path, json={} if method == "POST" else None, headers=auth("bob"))
                assert (r.status_code, r.json()["code"]) == (404, "snapshot_not_found"), (path, r.text)
            assert snap in app.state.manager.snapshots  # untouched by bob's tries
            r = await client.post(f"/snapshots/{snap}/restore", json={"session_id": "x" * 8}, headers=auth("alice"))
            assert r.status_code == 422  # a client-chosen id follows POST /sessions' pattern
            r = await client.post(f"/snapshots/{snap}/restore", json={}, headers=auth("alice"))
            assert r.status_code == 201, r.text
            new = r.json()["session_id"]
            assert app.state.manager.sessions[f"alice:{new}"].owner == "alice"  # servers.access.scoped
            r = await client.post(f"/sessions/{new}/step", json={"action": "right"}, headers=auth("bob"))
            assert r.status_code == 404
            r = await client.delete(f"/snapshots/{snap}", headers=auth("alice"))
            assert r.status_code == 204 and not app.state.manager.snapshots

    asyncio.run(main())


@pytest.mark.slow
def test_a_snapshot_whose_worker_died_is_not_found():
    import os
    import signal

    async def main():
        async with LocalEnvPool(max_workers=2, mode="process", imports=["user_env_module"]) as pool:
            d = await pool.reset(DRIFT)
            snap = await pool.snapshot(d.session_id)
            os.kill(pool.manager.pool.pid_of(d.session_id), signal.SIGKILL)

            async def noticed():  # the pool notices the death when the pipe closes
                return pool.manager.pool.broken_sessions()
            await wait_until_async(noticed, "the worker's death noticed")
            with pytest.raises(SnapshotNotFound):
                await pool.restore(snap)
            assert snap not in pool.manager.snapshots and not pool.manager.pool._snapshots
            workers = pool.manager.pool._workers  # its booking went with it: the dead worker is not kept
            assert not any(k.startswith("snapshot:") for w in workers for k in w.sessions)
            fresh = await pool.reset(DRIFT)  # the pool serves on
            assert (await pool.step(fresh.session_id, "right")).info["pos"] == 1

    asyncio.run(main())


def test_a_cancelled_snapshot_leaves_nothing_behind():
    async def main():
        async with LocalEnvPool(max_workers=2, mode="thread", imports=["user_env_module"]) as pool:
            d = await pool.reset(DRIFT, env_kwargs={"clone_s": 0.3})
            started, finished = DriftEnv.clones_started, DriftEnv.clones_finished
            task = asyncio.ensure_future(pool.snapshot(d.session_id))

            async def cloning():
                return DriftEnv.clones_started > started
            await wait_until_async(cloning, "the clone runs in its thread")
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

            async def dropped():  # the clone finished; its snapshot is dropped after it
                return (DriftEnv.clones_finished > finished and not pool.manager.snapshots
                        and not pool.manager.pool._host.snapshots)
            await wait_until_async(dropped, "the cancelled clone's snapshot dropped")
            assert (await pool.step(d.session_id, "right")).info["pos"] == 1  # the session goes on

    asyncio.run(main())


def test_the_reaper_survives_a_snapshot_dropped_while_it_runs():
    async def main():
        async with LocalEnvPool(max_workers=2, mode="thread", imports=["user_env_module"]) as pool:
            pool.manager.settings.session_ttl_s = 0.05
            d = await pool.reset(DRIFT)
            snaps = [await pool.snapshot(d.session_id) for _ in range(3)]
            await asyncio.sleep(0.1)
            reaped, *dropped = await asyncio.gather(pool.manager.reap(),
                                                    *(pool.manager.drop_snapshot(s) for s in snaps),
                                                    return_exceptions=True)
            assert reaped is None, reaped  # the reaper's pass did not fail (a client's drop may 404)
            assert not pool.manager.snapshots and not pool.manager.pool._host.snapshots

    asyncio.run(main())


@pytest.mark.slow
def test_closing_a_session_while_it_is_snapshotted_keeps_the_snapshot_usable():
    async def main():
        async with LocalEnvPool(max_workers=2, mode="process", imports=["user_env_module"]) as pool:
            d = await pool.reset(DRIFT, env_kwargs={"clone_s": 0.3})
            first = await pool.step(d.session_id, "right")
            task = asyncio.ensure_future(pool.snapshot(d.session_id))
            await asyncio.sleep(0.05)
            await pool.close(d.session_id)  # while the worker clones its state
            snap = await task
            r = await pool.restore(snap)
            assert r.observation == first.observation
            await pool.drop_snapshot(snap)
            await pool.close(r.session_id)
            workers = pool.manager.pool._workers
            assert not any(k.startswith("snapshot:") for w in workers for k in w.sessions)

    asyncio.run(main())
