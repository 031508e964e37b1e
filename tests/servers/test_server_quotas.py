"""Per-client quotas of the env server (``--client-max-sessions``, ``--client-max-snapshots``,
``--client-max-workers``; default: each pool over the number of ``--token-file`` clients): a client at its quota
gets 503 ``quota_exceeded`` naming the quota, and another client still gets 201. Snapshots keep their worker, so a
client holding snapshots and no session holds workers: it is bounded by its worker share, not by the whole pool."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import httpx

from served_envs import start_server
from servers.serve import build_parser
from servers_helpers import ECHO, make_app, serve_asgi

pytestmark = pytest.mark.slow  # env worker processes

DRIFT = "user/Drift-v0"  # has clone_state/set_state (user_env_module)
TOKENS = {"alice": "tok-alice-5b1e", "bob": "tok-bob-77c2"}


def auth(name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKENS[name]}"}


def test_a_client_at_its_session_quota_leaves_the_others_room():
    async def main():
        app = make_app([DRIFT], tokens=TOKENS, max_sessions=8, workers=8)  # fair share: 4 sessions each
        async with serve_asgi(app) as client:
            for _ in range(4):
                r = await client.post("/sessions", json={"env_id": DRIFT}, headers=auth("alice"))
                assert r.status_code == 201, r.text
            r = await client.post("/sessions", json={"env_id": DRIFT}, headers=auth("alice"))
            assert (r.status_code, r.json()["code"]) == (503, "quota_exceeded"), r.text
            assert "client_max_sessions=4" in r.json()["detail"] and r.headers["retry-after"] == "1"
            assert sum(s.owner == "alice" for s in app.state.manager.sessions.values()) == 4  # nothing opened
            r = await client.post("/sessions", json={"env_id": DRIFT}, headers=auth("bob"))
            assert r.status_code == 201, r.text

    asyncio.run(main())


def test_snapshots_of_one_client_do_not_take_the_workers_another_needs():
    """A client holding 4 snapshots and no session, on a 4-worker server of two clients: the other's open is 201
    (before the worker quota the snapshots kept all 4 workers and it was 503)."""
    async def main():
        app = make_app([DRIFT], tokens=TOKENS, max_sessions=8, workers=4)
        async with serve_asgi(app) as client:
            for _ in range(4):
                r = await client.post("/sessions", json={"env_id": DRIFT}, headers=auth("alice"))
                assert r.status_code == 201, r.text
                sid = r.json()["session_id"]
                r = await client.post(f"/sessions/{sid}/snapshot", headers=auth("alice"))
                assert r.status_code == 201, r.text
                assert (await client.delete(f"/sessions/{sid}", headers=auth("alice"))).status_code == 204
            manager = app.state.manager
            assert len(manager.snapshots) == 4 and not manager.sessions
            held = {w.index for w in manager.pool._workers if "alice" in w.owners.values()}
            assert len(held) == 2  # client_max_workers: 4 workers over 2 clients
            for _ in range(2):  # bob's two workers
                r = await client.post("/sessions", json={"env_id": DRIFT}, headers=auth("bob"))
                assert r.status_code == 201, r.text
            # alice's sessions still open, on her own workers (restore too: where the state is)
            r = await client.post("/sessions", json={"env_id": DRIFT}, headers=auth("alice"))
            assert r.status_code == 201, r.text
            assert manager.pool.worker_of(f"alice:{r.json()['session_id']}") in held  # servers.access.scoped

    asyncio.run(main())


def test_a_client_at_its_snapshot_or_worker_quota_is_refused_naming_it():
    async def main():
        app = make_app([DRIFT], tokens=TOKENS, max_sessions=8, workers=4, client_max_snapshots=2,
                       client_max_workers=1, max_sessions_per_worker=2)
        async with serve_asgi(app) as client:
            sids = []
            for _ in range(2):  # one worker, two slots
                r = await client.post("/sessions", json={"env_id": DRIFT}, headers=auth("alice"))
                assert r.status_code == 201, r.text
                sids.append(r.json()["session_id"])
            r = await client.post("/sessions", json={"env_id": DRIFT}, headers=auth("alice"))
            assert (r.status_code, r.json()["code"]) == (503, "quota_exceeded"), r.text
            assert "client_max_workers=1" in r.json()["detail"]
            assert (await client.delete(f"/sessions/{sids.pop()}", headers=auth("alice"))).status_code == 204
            for _ in range(2):
                r = await client.post(f"/sessions/{sids[0]}/snapshot", headers=auth("alice"))
                assert r.status_code == 201, r.text
            r = await client.post(f"/sessions/{sids[0]}/snapshot", headers=auth("alice"))
            assert (r.status_code, r.json()["code"]) == (503, "quota_exceeded"), r.text
            assert "client_max_snapshots=2" in r.json()["detail"]
            assert len(app.state.manager.snapshots) == 2
            r = await client.post("/sessions", json={"env_id": DRIFT}, headers=auth("bob"))
            assert r.status_code == 201, r.text
            r = await client.post(f"/sessions/{r.json()['session_id']}/snapshot", headers=auth("bob"))
            assert r.status_code == 201, r.text

    asyncio.run(main())


def test_the_quota_flags_are_in_the_help_with_their_defaults():
    text = build_parser().format_help()
    for flag in ("--client-max-sessions", "--client-max-snapshots", "--client-max-workers"):
        assert flag in text
    assert "over the number of clients" in text
    args = build_parser().parse_args(["--env", "x", "--client-max-sessions", "3", "--client-max-snapshots", "5"])
    assert (args.client_max_sessions, args.client_max_snapshots, args.client_max_workers) == (3, 5, None)


def test_the_served_flags_hold_each_client_to_its_quota(tmp_path: Path):
    """``python -m servers.serve --token-file ... --client-max-sessions 1 --client-max-snapshots 1``: alice's second
    session and second snapshot are 503 ``quota_exceeded`` naming each flag's quota, bob still gets 201."""
    token_file = tmp_path / "tokens.txt"
    token_file.write_text("".join(f"{n}: {t}\n" for n, t in TOKENS.items()))
    proc, url = start_server([DRIFT], ["--token-file", str(token_file), "--import", "user_env_module",
                                       "--workers", "4", "--max-sessions", "8", "--client-max-sessions", "1",
                                       "--client-max-snapshots", "1"], tmp_path / "server.log", token=None)
    try:
        r = httpx.post(url + "/sessions", json={"env_id": DRIFT}, headers=auth("alice"), timeout=60)
        assert r.status_code == 201, r.text
        sid = r.json()["session_id"]
        r = httpx.post(url + "/sessions", json={"env_id": DRIFT}, headers=auth("alice"), timeout=60)
        assert (r.status_code, r.json()["code"]) == (503, "quota_exceeded") and "client_max_sessions=1" in r.text
        assert httpx.post(url + f"/sessions/{sid}/snapshot", headers=auth("alice"), timeout=60).status_code == 201
        r = httpx.post(url + f"/sessions/{sid}/snapshot", headers=auth("alice"), timeout=60)
        assert (r.status_code, r.json()["code"]) == (503, "quota_exceeded") and "client_max_snapshots=1" in r.text
        r = httpx.post(url + "/sessions", json={"env_id": DRIFT}, headers=auth("bob"), timeout=60)
        assert r.status_code == 201, r.text
    finally:
        proc.terminate()
        proc.wait(60)


def test_concurrent_resets_of_one_client_never_generate_past_its_new_task_quota(tmp_path: Path):
    """Each reset was allowed to generate when the quota was not yet used, and counted only after it ended: two
    resets in flight at once both generated with a quota of one. A reset that may generate now holds a place of the
    quota while it runs: the second is refused (503 ``quota_exceeded``) while the first is in flight, the first
    generates its task, and another client still generates its own."""
    from waiting import wait_until_async

    async def main():
        app = make_app([ECHO], tokens=TOKENS, client_max_new_tasks=1)
        gate = tmp_path / "go"
        async with serve_asgi(app) as client:
            first = asyncio.ensure_future(client.post(
                "/sessions", headers=auth("alice"),
                json={"env_id": ECHO, "options": {"generate": "a", "wait": str(gate)}}))
            manager = app.state.manager

            async def in_flight() -> bool:
                return any(s.owner == "alice" for s in manager.sessions.values())

            await wait_until_async(in_flight, what="alice's first reset in flight")
            r = await client.post("/sessions", json={"env_id": ECHO, "options": {"generate": "b"}},
                                  headers=auth("alice"))
            assert (r.status_code, r.json()["code"]) == (503, "quota_exceeded"), r.text
            r = await client.post("/sessions", json={"env_id": ECHO, "options": {"plain": True}},
                                  headers=auth("alice"))
            assert r.status_code == 201, r.text  # a reset that generates nothing is not bounded by the quota
            gate.touch()
            r = await first
            assert r.status_code == 201 and r.json()["info"]["task_generated"] is True, r.text
            r = await client.post("/sessions", json={"env_id": ECHO, "options": {"generate": "c"}},
                                  headers=auth("alice"))
            assert (r.status_code, r.json()["code"]) == (503, "quota_exceeded"), r.text  # the quota is used
            r = await client.post("/sessions", json={"env_id": ECHO, "options": {"generate": "d"}},
                                  headers=auth("bob"))
            assert r.status_code == 201 and r.json()["info"]["task_generated"] is True, r.text

    asyncio.run(main())
