"""The env server in-process (``httpx.ASGITransport``): every route, and every bad input answered with its HTTP
code while the other sessions keep being served."""

from __future__ import annotations

import asyncio
import os

import pytest

from servers_helpers import CACHED, CALC, ECHO, make_app, serve_asgi
from waiting import wait_until, wait_until_async

# Calculator problem 0 (hand-checked): "Tom saves 17 dollars a week for 13 weeks and spends 6 dollars. How many
# dollars are left?" -> 17 * 13 - 6 = 221 - 6 = 215.
PROBLEM0 = {"index": 0}


def run(coro):
    return asyncio.run(coro)


async def open_session(client, env_id=ECHO, **body):
    r = await client.post("/sessions", json={"env_id": env_id, **body})
    assert r.status_code == 201, r.text
    return r.json()


async def assert_bystander_ok(client, session_id, action="ping"):
    """The other session still steps normally."""
    r = await client.post(f"/sessions/{session_id}/step", json={"action": action})
    assert r.status_code == 200, r.text
    assert r.json()["observation"] == f"echo: {action}"


def test_calculator_episode_over_http():
    async def main():
        async with serve_asgi(make_app()) as c:
            created = await open_session(c, CALC, options=PROBLEM0)
            assert created["observation"].startswith("Tom saves 17 dollars a week for 13 weeks and spends 6")
            assert created["info"]["task_id"] == "calculator/0"
            assert created["info"]["task_type"] == "savings"
            assert "calc[17 * 13]" in created["info"]["admissible_actions"]
            sid = created["session_id"]
            r = await c.post(f"/sessions/{sid}/step", json={"action": "calc[17 * 13 - 6]"})
            assert r.status_code == 200
            assert r.json() == {"observation": "Result: 215", "reward": 0.0, "terminated": False,
                                "truncated": False, "info": r.json()["info"]}
            assert "answer[215]" in r.json()["info"]["admissible_actions"]
            r = await c.post(f"/sessions/{sid}/step", json={"action": "answer[215]"})
            body = r.json()
            assert (body["observation"], body["reward"], body["terminated"], body["info"]["won"]) == (
                "Correct!", 1.0, True, True)
            listed = (await c.get("/sessions")).json()["sessions"]
            assert [(s["session_id"], s["steps"], s["done"]) for s in listed] == [(sid, 2, True)]
            assert (await c.delete(f"/sessions/{sid}")).status_code == 204
            assert (await c.get("/sessions")).json()["sessions"] == []
            assert (await c.get("/envs")).json() == {"env_ids": [CALC, ECHO], "envs": [
                {"env_id": e, "openenv_path": f"/envs/{e}", "mcp_path": f"/envs/{e}/mcp"} for e in (CALC, ECHO)]}
    run(main())


def test_numpy_info_is_sent_as_json_numbers_and_reset_route():
    async def main():
        async with serve_asgi(make_app()) as c:
            s = await open_session(c, options={"tag": "a"})
            assert s["info"]["t"] == 0 and s["info"]["options"] == {"tag": "a"}
            r = (await c.post(f"/sessions/{s['session_id']}/step", json={"action": "x"})).json()
            assert r["info"]["t"] == 1 and r["info"]["score"] == 0.5
            r = await c.post(f"/sessions/{s['session_id']}/reset", json={"seed": 3, "options": {"tag": "b"}})
            assert r.status_code == 200 and r.json()["info"]["options"] == {"tag": "b"}
            listed = (await c.get("/sessions")).json()["sessions"]
            assert listed[0]["episodes"] == 2
    run(main())


def test_openapi_documents_every_route_and_shape():
    async def main():
        async with serve_asgi(make_app()) as c:
            schema = (await c.get("/openapi.json")).json()
            openenv = {f"/envs/{e}/{r}" for e in (CALC, ECHO) for r in (  # servers/openenv.py (WS, MCP: no OpenAPI)
                "reset", "step", "state", "schema", "metadata", "health", "splits", "tasks", "num_tasks", "task",
                "task_range")}
            assert set(schema["paths"]) == {"/health", "/envs", "/sessions", "/sessions/{session_id}/step",
                                            "/sessions/{session_id}/reset", "/sessions/{session_id}",
                                            "/sessions/{session_id}/snapshot", "/snapshots/{snapshot_id}/restore",
                                            "/snapshots/{snapshot_id}"} | openenv
            for name in ("CreateSessionRequest", "StepRequest", "StepResponse", "ResetResponse", "ErrorResponse",
                         "SnapshotResponse", "RestoreRequest"):
                assert name in schema["components"]["schemas"]
            step = schema["paths"]["/sessions/{session_id}/step"]["post"]["responses"]
            assert {"200", "404", "409", "413", "422", "500"} <= set(step)
    run(main())


def test_malformed_json_is_400_invalid_json():
    async def main():
        async with serve_asgi(make_app()) as c:
            other = (await open_session(c))["session_id"]
            r = await c.post(f"/sessions/{other}/step", content=b'{"action": "go', headers={"content-type": "application/json"})
            assert (r.status_code, r.json()["code"]) == (400, "invalid_json")
            r = await c.post("/sessions", content=b"not json", headers={"content-type": "application/json"})
            assert (r.status_code, r.json()["code"]) == (400, "invalid_json")
            await assert_bystander_ok(c, other)
    run(main())


@pytest.mark.parametrize("path_kind,body", [
    ("step", {"action": 3}),
    ("step", {"action": ["go"]}),
    ("step", {}),
    ("step", {"action": "go", "extra": 1}),
    ("create", {"env_id": 5}),
    ("create", {"env_id": ECHO, "seed": "1"}),
    ("create", {"env_id": ECHO, "options": "index=0"}),
])
def test_wrong_types_are_422(path_kind, body):
    async def main():
        async with serve_asgi(make_app()) as c:
            other = (await open_session(c))["session_id"]
            path = f"/sessions/{other}/step" if path_kind == "step" else "/sessions"
            r = await c.post(path, json=body)
            assert r.status_code == 422, r.text
            assert isinstance(r.json()["detail"], list)
            await assert_bystander_ok(c, other)
    run(main())


def test_invalid_utf8_is_422():
    async def main():
        async with serve_asgi(make_app()) as c:
            other = (await open_session(c))["session_id"]
            r = await c.post(f"/sessions/{other}/step", content=b'{"action": "caf\xe9 \xff"}',
                             headers={"content-type": "application/json"})
            assert r.status_code == 422
            assert "UTF-8" in r.json()["detail"][0]["msg"]
            await assert_bystander_ok(c, other)
    run(main())


def test_unknown_session_and_unknown_env_are_404():
    async def main():
        async with serve_asgi(make_app()) as c:
            other = (await open_session(c))["session_id"]
            for method, path, body in [("POST", "/sessions/nope/step", {"action": "x"}),
                                       ("POST", "/sessions/nope/reset", {}), ("DELETE", "/sessions/nope", None)]:
                r = await c.request(method, path, json=body)
                assert (r.status_code, r.json()["code"]) == (404, "session_not_found")
            r = await c.post("/sessions", json={"env_id": "agent_rl/NoSuchEnv-v0"})
            assert (r.status_code, r.json()["code"]) == (404, "unknown_env")
            await assert_bystander_ok(c, other)
    run(main())


def test_one_megabyte_action_is_413():
    async def main():
        async with serve_asgi(make_app()) as c:
            other = (await open_session(c))["session_id"]
            r = await c.post(f"/sessions/{other}/step", json={"action": "a" * 2**20})
            assert r.status_code == 413
            await assert_bystander_ok(c, other)
    run(main())


def test_action_limit_counts_utf8_bytes():
    async def main():
        async with serve_asgi(make_app(max_action_bytes=1000)) as c:
            other = (await open_session(c))["session_id"]
            # 500 x "é" = 500 characters but 1000 bytes: accepted; 501 = 1002 bytes: 413 (the route's check).
            assert (await c.post(f"/sessions/{other}/step", json={"action": "é" * 500})).status_code == 200
            r = await c.post(f"/sessions/{other}/step", json={"action": "é" * 501})
            assert (r.status_code, r.json()["code"]) == (413, "action_too_large")
            await assert_bystander_ok(c, other)
    run(main())


def test_step_after_episode_end_is_409_until_reset():
    async def main():
        async with serve_asgi(make_app()) as c:
            other = (await open_session(c))["session_id"]
            sid = (await open_session(c, CALC, options=PROBLEM0))["session_id"]
            assert (await c.post(f"/sessions/{sid}/step", json={"action": "answer[1]"})).json()["terminated"]
            r = await c.post(f"/sessions/{sid}/step", json={"action": "answer[215]"})
            assert (r.status_code, r.json()["code"]) == (409, "episode_over")
            # truncated ends it too: gymnasium's TimeLimit via env_kwargs
            tid = (await open_session(c, env_kwargs={"max_episode_steps": 2}))["session_id"]
            steps = [(await c.post(f"/sessions/{tid}/step", json={"action": "a"})).json()["truncated"] for _ in range(2)]
            assert steps == [False, True]
            assert (await c.post(f"/sessions/{tid}/step", json={"action": "a"})).status_code == 409
            # reset makes the session steppable again
            assert (await c.post(f"/sessions/{sid}/reset", json={"options": PROBLEM0})).status_code == 200
            r = await c.post(f"/sessions/{sid}/step", json={"action": "answer[215]"})
            assert r.json()["reward"] == 1.0
            await assert_bystander_ok(c, other)
    run(main())


async def wait_busy(client, session_id) -> None:
    """Until ``GET /sessions`` lists the session busy (its request is in the env)."""
    async def busy():
        return any(s["session_id"] == session_id and s["busy"]
                   for s in (await client.get("/sessions")).json()["sessions"])
    await wait_until_async(busy, f"session {session_id} busy")


def test_two_concurrent_steps_on_one_session_409(tmp_path):
    gate = tmp_path / "gate"  # the slow step lasts until this file exists

    async def main():
        async with serve_asgi(make_app()) as c:
            other = (await open_session(c))["session_id"]
            sid = (await open_session(c, options={"k": 1}))["session_id"]
            slow = asyncio.create_task(c.post(f"/sessions/{sid}/step", json={"action": f"wait:{gate}"}))
            await wait_busy(c, sid)
            r = await c.post(f"/sessions/{sid}/step", json={"action": "second"})
            assert (r.status_code, r.json()["code"]) == (409, "session_busy")
            await assert_bystander_ok(c, other)  # answered while the slow step still runs
            assert not slow.done()
            gate.touch()
            assert (await slow).json()["observation"] == f"echo: wait:{gate}"
            assert (await c.post(f"/sessions/{sid}/step", json={"action": "third"})).status_code == 200
    run(main())


def test_at_capacity_503_with_retry_after():
    async def main():
        async with serve_asgi(make_app(max_sessions=2)) as c:
            first = (await open_session(c))["session_id"]
            await open_session(c)
            r = await c.post("/sessions", json={"env_id": ECHO})
            assert (r.status_code, r.json()["code"]) == (503, "at_capacity")
            assert r.headers["Retry-After"] == "1"
            await assert_bystander_ok(c, first)
            await c.delete(f"/sessions/{first}")
            assert (await c.post("/sessions", json={"env_id": ECHO})).status_code == 201
    run(main())


def test_idle_sessions_expire_after_ttl():
    async def main():
        async with serve_asgi(make_app(session_ttl_s=0.3)) as c:
            sid = (await open_session(c))["session_id"]

            async def expired():
                return (await c.get("/health")).json()["expired_sessions"] == 1
            await wait_until_async(expired, "the idle session expired")
            assert (await c.post(f"/sessions/{sid}/step", json={"action": "x"})).status_code == 404
            health = (await c.get("/health")).json()
            assert (health["sessions"], health["expired_sessions"]) == (0, 1)
            fresh = (await open_session(c))["session_id"]
            await assert_bystander_ok(c, fresh)
    run(main())


def test_bearer_token():
    async def main():
        app = make_app(token="s3cret")
        async with serve_asgi(app) as anonymous:
            assert (await anonymous.get("/health")).status_code == 200  # health checks need no token
            r = await anonymous.post("/sessions", json={"env_id": ECHO})
            assert (r.status_code, r.headers["WWW-Authenticate"]) == (401, "Bearer")
            r = await anonymous.post("/sessions", json={"env_id": ECHO}, headers={"Authorization": "Bearer wrong"})
            assert r.status_code == 401
            assert (await anonymous.get("/sessions")).status_code == 401
            r = await anonymous.post("/sessions", json={"env_id": ECHO}, headers={"Authorization": "Bearer s3cret"})
            assert r.status_code == 201
    run(main())


def test_env_exception_is_500_and_closes_only_that_session():
    async def main():
        async with serve_asgi(make_app()) as c:
            other = (await open_session(c))["session_id"]
            sid = (await open_session(c, options={"k": 2}))["session_id"]
            r = await c.post(f"/sessions/{sid}/step", json={"action": "raise"})
            assert (r.status_code, r.json()["code"]) == (500, "env_error")
            assert "boom on purpose" in r.json()["detail"]
            assert (await c.post(f"/sessions/{sid}/step", json={"action": "x"})).status_code == 404
            await assert_bystander_ok(c, other)
    run(main())


def test_could_not_judge_is_500_env_infra_error_never_a_reward():
    # Issue 10: EnvInfraError from step or reset is the env's 5xx with its own code (docs/env_errors.md), not a
    # 422 (even though a reset raised it) and not a 200 with a reward.
    async def main():
        async with serve_asgi(make_app()) as c:
            other = (await open_session(c))["session_id"]
            sid = (await open_session(c, options={"k": 4}))["session_id"]
            r = await c.post(f"/sessions/{sid}/step", json={"action": "infra"})
            assert (r.status_code, r.json()["code"]) == (500, "env_infra_error")
            assert "could not judge on purpose" in r.json()["detail"]
            assert (await c.post(f"/sessions/{sid}/step", json={"action": "x"})).status_code == 404
            r = await c.post("/sessions", json={"env_id": ECHO, "options": {"raise": "infra"}})
            assert (r.status_code, r.json()["code"]) == (500, "env_infra_error")
            assert r.json()["detail"].endswith("no session was opened")
            await assert_bystander_ok(c, other)
    run(main())


def test_invalid_env_kwargs_seed_or_options_are_422_not_500():
    # make/reset rejecting what the client sent is the client's error: 422 invalid_request with the env's reason.
    async def main():
        async with serve_asgi(make_app()) as c:
            other = (await open_session(c))["session_id"]
            for body, reason in [({"env_id": CALC, "options": {"index": -1}}, "ValueError: expected non-negative"),
                                 ({"env_id": CALC, "env_kwargs": {"bogus": 1}}, "unexpected keyword argument"),
                                 ({"env_id": ECHO, "seed": -5}, "Seed must be greater or equal to zero"),
                                 ({"env_id": ECHO, "options": {"raise": "IndexError"}}, "IndexError: reset raised")]:
                r = await c.post("/sessions", json=body)
                assert (r.status_code, r.json()["code"]) == (422, "invalid_request"), r.text
                assert reason in r.json()["detail"] and r.json()["detail"].endswith("no session was opened")
            sid = (await open_session(c, CALC, options=PROBLEM0))["session_id"]
            r = await c.post(f"/sessions/{sid}/reset", json={"options": {"index": "x"}})
            assert (r.status_code, r.json()["code"]) == (422, "invalid_request")
            assert "invalid literal for int()" in r.json()["detail"]
            assert r.json()["detail"].endswith("the session was closed")
            r = await c.post("/sessions", json={"env_id": ECHO, "options": {"raise": "RuntimeError"}})
            assert (r.status_code, r.json()["code"]) == (500, "env_error")  # any other exception: the env's fault
            assert r.json()["detail"].endswith("reset raised on purpose; no session was opened")
            assert (await c.get("/sessions")).json()["sessions"][0]["session_id"] == other  # only the good one left
            await assert_bystander_ok(c, other)
    run(main())


def test_dead_worker_is_500_and_server_keeps_serving():
    async def main():
        async with serve_asgi(make_app()) as c:
            other = (await open_session(c))["session_id"]
            sid = (await open_session(c, options={"k": 3}))["session_id"]
            r = await c.post(f"/sessions/{sid}/step", json={"action": "exit"})
            assert (r.status_code, r.json()["code"]) == (500, "env_error")
            assert (await c.post(f"/sessions/{sid}/step", json={"action": "x"})).status_code == 404
            await assert_bystander_ok(c, other)
            again = (await open_session(c, options={"k": 3}))["session_id"]
            await assert_bystander_ok(c, again)
    run(main())


def test_a_slow_reset_does_not_stall_other_sessions(tmp_path):
    gate = tmp_path / "gate"  # the slow reset lasts until this file exists

    async def main():
        async with serve_asgi(make_app()) as c:
            other = (await open_session(c))["session_id"]
            slow = asyncio.create_task(c.post("/sessions", json={"env_id": ECHO, "options": {"wait": str(gate)}}))

            async def opening():  # the slow session is listed (busy) while it is made and reset
                return len((await c.get("/sessions")).json()["sessions"]) == 2
            await wait_until_async(opening, "the slow reset started")
            for _ in range(3):  # steps of the other session complete while the reset still runs
                await assert_bystander_ok(c, other)
            assert not slow.done()
            gate.touch()
            assert (await slow).status_code == 201
    run(main())


def test_same_task_goes_to_the_worker_that_loaded_it():
    async def main():
        async with serve_asgi(make_app([CACHED])) as c:
            # an env that declares a per-process cache (as ALFWorld does); see test_server_placement.py for the rest
            a = await open_session(c, CACHED, options={"index": 5})
            b = await open_session(c, CACHED, options={"index": 5})
            d = await open_session(c, CACHED, options={"index": 6})
            workers = {s["session_id"]: s["worker"] for s in (await c.get("/sessions")).json()["sessions"]}
            assert workers[a["session_id"]] == workers[b["session_id"]] != workers[d["session_id"]]
            for s in (a, b, d):
                await c.delete(f"/sessions/{s['session_id']}")
            # all workers idle now: index 6 goes back to the worker that had it, index 5 to its own
            e = await open_session(c, CACHED, options={"index": 6})
            workers2 = {s["session_id"]: s["worker"] for s in (await c.get("/sessions")).json()["sessions"]}
            assert workers2[e["session_id"]] == workers[d["session_id"]]
            assert (await c.get("/health")).json()["started_workers"] == 2
    run(main())


def test_workers_are_reused_then_recycled_and_memory_stays_flat():
    async def main():
        # 3 resets per worker: sequential sessions 1-3 share worker 0, session 4 needs a new one, ...
        async with serve_asgi(make_app(max_resets_per_worker=3)) as c:
            for _ in range(7):
                sid = (await open_session(c, CALC))["session_id"]
                await c.delete(f"/sessions/{sid}")
            assert (await c.get("/health")).json()["started_workers"] == 3  # ceil(7 / 3)
        async with serve_asgi(make_app()) as c:
            rss = []
            for i in range(300):
                sid = (await open_session(c, CALC, options={"index": i}))["session_id"]
                await c.post(f"/sessions/{sid}/step", json={"action": "calc[1 + 1]"})
                await c.delete(f"/sessions/{sid}")
                if i in (49, 299):
                    rss.append((await c.get("/health")).json()["worker_rss_mb"])
            health = (await c.get("/health")).json()
            assert health["started_workers"] == 1  # one process served all 300 sessions
            assert rss[1] - rss[0] < 8.0, rss  # MiB over 250 more sessions
    run(main())


def test_graceful_shutdown_ends_every_worker():
    async def main():
        async with serve_asgi(make_app()) as c:
            for k in range(3):
                await open_session(c, options={"k": k})
            pids = (await c.get("/health")).json()["worker_pids"]
            assert len(pids) == 3
        wait_until(lambda: not any(_running(p) for p in pids), "every worker exited")
    run(main())


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_env_call_over_the_timeout_is_504_and_the_server_keeps_serving():
    async def main():
        # an Echo op takes far less than 3 s even on a busy machine; the step below sleeps far longer (ended at 3 s)
        async with serve_asgi(make_app(env_timeout_s=3.0)) as c:
            other = (await open_session(c))["session_id"]
            sid = (await open_session(c, options={"k": 4}))["session_id"]
            r = await c.post(f"/sessions/{sid}/step", json={"action": "sleep:600"})
            assert (r.status_code, r.json()["code"]) == (504, "env_timeout")
            assert (await c.post(f"/sessions/{sid}/step", json={"action": "x"})).status_code == 404
            await assert_bystander_ok(c, other)
    run(main())


@pytest.mark.skipif(not __import__("envs.hosting.child").hosting.child.can_renice(), reason="needs CAP_SYS_NICE")
def test_resets_run_at_lower_priority_than_steps():
    async def main():
        base = os.getpriority(os.PRIO_PROCESS, 0)
        async with serve_asgi(make_app()) as c:
            s = await open_session(c)
            assert s["info"]["nice"] == min(19, base + 10)  # the default reset_nice
            r = (await c.post(f"/sessions/{s['session_id']}/step", json={"action": "x"})).json()
            assert r["info"]["nice"] == base
        async with serve_asgi(make_app(reset_nice=0)) as c:
            assert (await open_session(c))["info"]["nice"] == base
    run(main())


def test_a_session_never_joins_a_worker_busy_with_another_task():
    async def main():
        async with serve_asgi(make_app([CACHED])) as c:
            a = await open_session(c, CACHED, options={"index": 7})
            await c.delete(f"/sessions/{a['session_id']}")  # worker 0 is idle and remembers index 7
            b = await open_session(c, CACHED, options={"index": 8})  # takes the idle worker 0
            d = await open_session(c, CACHED, options={"index": 7})  # worker 0 knows 7 but plays 8: a new worker
            workers = {s["session_id"]: s["worker"] for s in (await c.get("/sessions")).json()["sessions"]}
            assert (workers[b["session_id"]], workers[d["session_id"]]) == (0, 1)
    run(main())


def test_closed_sessions_envs_are_reused_but_never_after_they_raised():
    async def main():
        async with serve_asgi(make_app()) as c:
            a = await open_session(c)
            await c.delete(f"/sessions/{a['session_id']}")
            b = await open_session(c)  # same env id + kwargs: the kept env, reset
            assert b["info"]["instance"] == a["info"]["instance"] and b["info"]["t"] == 0
            other = await open_session(c, env_kwargs={"prefix": "other"})  # other kwargs: never that env
            assert other["info"]["instance"] != a["info"]["instance"]
            r = await c.post(f"/sessions/{b['session_id']}/step", json={"action": "raise"})
            assert r.status_code == 500
            d = await open_session(c)
            assert d["info"]["instance"] != a["info"]["instance"]  # the env that raised was closed
    run(main())
