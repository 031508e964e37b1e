"""The env clients: ``HTTPEnvPool`` and ``LocalEnvPool`` give the same results through the same interface;
HTTP retries on 503 and on connect errors (server started late); several URLs spread sessions."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "servers"))  # user_env_module, servers_helpers

from servers_helpers import CALC, ECHO, free_port, make_app, serve_asgi, uvicorn_in_thread  # noqa: E402
from waiting import wait_until_async  # noqa: E402

from agent_rl.envclient import (  # noqa: E402
    EnvClientError,
    EnvPool,
    EnvServerError,
    EnvUnavailable,
    EpisodeOver,
    HTTPEnvPool,
    LocalEnvPool,
    ResetResult,
    SessionNotFound,
    StepResult,
)
from servers.access import unscoped  # noqa: E402


async def play_problem0(pool: EnvPool) -> list:
    """Calculator problem 0 (17 * 13 - 6 = 215): one tool call, one answer, then one step too many."""
    assert isinstance(pool, EnvPool)
    r = await pool.reset(CALC, options={"index": 0})
    assert isinstance(r, ResetResult)
    s1 = await pool.step(r.session_id, "calc[17 * 13 - 6]")
    s2 = await pool.step(r.session_id, "answer[215]")
    assert isinstance(s2, StepResult)
    with pytest.raises(EpisodeOver):
        await pool.step(r.session_id, "answer[215]")
    await pool.close(r.session_id)
    await pool.close(r.session_id)  # idempotent
    with pytest.raises(SessionNotFound):
        await pool.step(r.session_id, "calc[1]")
    return [r.observation, r.info, (s1.observation, s1.reward, s1.terminated, s1.truncated, s1.info),
            (s2.observation, s2.reward, s2.terminated, s2.truncated, s2.info)]


def test_same_results_in_process_in_workers_and_over_http():
    async def main():
        async with LocalEnvPool(max_workers=2, mode="thread") as pool:
            threaded = await play_problem0(pool)
        async with LocalEnvPool(max_workers=2, mode="process") as pool:
            in_workers = await play_problem0(pool)
        app = make_app()
        async with serve_asgi(app):
            async with HTTPEnvPool("http://localhost", transport=httpx.ASGITransport(app=app)) as pool:
                over_http = await play_problem0(pool)
        assert threaded[2][:4] == ("Result: 215", 0.0, False, False)
        assert threaded[3][:4] == ("Correct!", 1.0, True, False)
        assert threaded == in_workers == over_http
    asyncio.run(main())


def test_user_env_and_env_errors_through_both_pools():
    async def main():
        app = make_app()
        async with serve_asgi(app):
            http = HTTPEnvPool("http://localhost", transport=httpx.ASGITransport(app=app))
            local = LocalEnvPool(max_workers=2, mode="thread", imports=["user_env_module"])
            for pool in (http, local):
                r = await pool.reset(ECHO, env_kwargs={"prefix": "hi"})
                assert r.observation == "hi: ready"
                s = await pool.step(r.session_id, "stop")
                assert (s.observation, s.reward, s.terminated, s.info["t"], s.info["score"]) == (
                    "hi: stop", 1.0, True, 1, 0.5)
                r = await pool.reset(ECHO)
                with pytest.raises(EnvServerError):
                    await pool.step(r.session_id, "raise")
                with pytest.raises(SessionNotFound):  # the failed session was closed
                    await pool.step(r.session_id, "x")
                await pool.aclose()
    asyncio.run(main())


def test_could_not_judge_and_non_str_actions_through_every_pool():
    # Issue 10: EnvInfraError reaches the client as EnvServerError(code="env_infra_error") in-process, in worker
    # processes and over HTTP; a non-str action is refused before the env sees it (HTTP: 422) in all three.
    async def main():
        app = make_app()
        async with serve_asgi(app):
            pools = [HTTPEnvPool("http://localhost", transport=httpx.ASGITransport(app=app)),
                     LocalEnvPool(max_workers=1, mode="thread", imports=["user_env_module"]),
                     LocalEnvPool(max_workers=1, mode="process", imports=["user_env_module"])]
            for pool in pools:
                r = await pool.reset(ECHO)
                with pytest.raises(EnvServerError) as info:
                    await pool.step(r.session_id, "infra")
                assert info.value.code == "env_infra_error" and "could not judge on purpose" in str(info.value)
                with pytest.raises(EnvServerError) as info:
                    await pool.reset(ECHO, options={"raise": "infra"})
                assert info.value.code == "env_infra_error"
                r = await pool.reset(ECHO)
                for bad in (1, None, ["stop"], b"stop"):
                    with pytest.raises(EnvClientError) as info:
                        await pool.step(r.session_id, bad)  # type: ignore[arg-type]
                    assert not isinstance(info.value, EnvServerError) and info.value.status in (None, 422)
                s = await pool.step(r.session_id, "stop")  # the session survived the refused actions
                assert s.terminated
                await pool.aclose()
    asyncio.run(main())


def test_http_retries_on_503_until_a_slot_frees():
    async def main():
        app = make_app(max_sessions=1)
        async with serve_asgi(app):
            pool = HTTPEnvPool("http://localhost", transport=httpx.ASGITransport(app=app), retries=5,
                               backoff_s=0.05)
            first = await pool.reset(ECHO)

            async def free_later():
                await asyncio.sleep(0.5)
                await pool.close(first.session_id)

            closer = asyncio.create_task(free_later())
            second = await pool.reset(ECHO)  # 503 + Retry-After: 1 -> waits, then succeeds
            await closer
            assert second.observation == "echo: ready"
            no_retry = HTTPEnvPool("http://localhost", transport=httpx.ASGITransport(app=app), retries=0)
            with pytest.raises(EnvUnavailable) as info:
                await no_retry.reset(ECHO)
            assert info.value.status == 503
            await pool.aclose()
    asyncio.run(main())


def test_http_retries_connect_errors_while_the_server_starts_late():
    port = free_port()
    url = f"http://127.0.0.1:{port}"

    async def main():
        async with HTTPEnvPool(url, retries=8, backoff_s=0.2, max_backoff_s=1.0) as pool:
            r = await pool.reset(CALC, options={"index": 0})
            assert r.observation.startswith("Tom saves 17 dollars")
            assert (await pool.step(r.session_id, "answer[215]")).reward == 1.0
        async with HTTPEnvPool(f"http://127.0.0.1:{free_port()}", retries=1, backoff_s=0.05) as dead:
            with pytest.raises(EnvUnavailable):
                await dead.reset(CALC)

    with uvicorn_in_thread(make_app(), port, delay_s=1.0):
        asyncio.run(main())


def test_sessions_spread_over_several_urls():
    ports = [free_port(), free_port()]
    urls = [f"http://127.0.0.1:{p}" for p in ports]

    async def main():
        async with HTTPEnvPool(urls, retries=20, backoff_s=0.1, max_backoff_s=0.5) as pool:
            results = [await pool.reset(ECHO) for _ in range(4)]
            assert pool.sessions_per_url == {urls[0]: 2, urls[1]: 2}
            # each session answers from the server that holds it (different worker processes per server)
            steps = await asyncio.gather(*(pool.step(r.session_id, f"a{i}") for i, r in enumerate(results)))
            assert [s.observation for s in steps] == [f"echo: a{i}" for i in range(4)]
            health = await pool.health()
            assert [h["sessions"] for h in health] == [2, 2]
            held = pool.url_of(results[0].session_id)
            await pool.close(results[0].session_id)
            assert pool.sessions_per_url[held] == 1
            again = await pool.reset(ECHO)  # goes where there are fewer
            assert pool.url_of(again.session_id) == held
            assert pool.sessions_per_url == {urls[0]: 2, urls[1]: 2}

    with uvicorn_in_thread(make_app(), ports[0]), uvicorn_in_thread(make_app(), ports[1]):
        asyncio.run(main())


class LoseAnswers(httpx.AsyncBaseTransport):
    """Serves every request, then drops the answer of the ones ``lose(request)`` picks (as a connection closed
    mid-response does): the server did the work, the client never learns the result."""

    def __init__(self, inner: httpx.AsyncBaseTransport, lose) -> None:
        self.inner, self.lose, self.lost = inner, lose, 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self.inner.handle_async_request(request)
        if self.lose(request):
            self.lost += 1
            await response.aread()
            raise httpx.RemoteProtocolError("peer closed connection without sending complete message body")
        return response


def test_lost_answers_leave_no_session_behind():
    # A reset whose answer is lost opened a session the client cannot name, unless the client named it: the pool
    # sends its own session_id, remembers it as an orphan and deletes it later; a lost DELETE likewise.
    async def main():
        app = make_app()
        async with serve_asgi(app):
            manager = app.state.manager
            to_lose = [("POST", "/sessions")]  # (method, path) of the next answers to drop, each once

            def lose(request: httpx.Request) -> bool:
                key = (request.method, request.url.path)
                if key in to_lose:
                    to_lose.remove(key)
                    return True
                return False

            transport = LoseAnswers(httpx.ASGITransport(app=app), lose)
            pool = HTTPEnvPool("http://localhost", transport=transport, retries=0)
            with pytest.raises(EnvServerError):
                await pool.reset(ECHO)
            assert len(manager.sessions) == 1 and list(pool.orphans) == [unscoped(k) for k in manager.sessions]
            r = await pool.reset(ECHO)  # deletes the orphan in the background

            async def orphan_deleted():
                return pool.orphans_closed == 1
            await wait_until_async(orphan_deleted, "the orphan deleted in the background")
            assert [unscoped(k) for k in manager.sessions] == [r.session_id] and pool.orphans == {} and pool.orphans_closed == 1
            to_lose.append(("DELETE", f"/sessions/{r.session_id}"))
            await pool.close(r.session_id)  # done, but its answer is lost: the client cannot know, an orphan again
            assert list(pool.orphans) == [r.session_id] and manager.sessions == {}
            await pool.aclose()  # the final clean-up asks again: 404, nothing left to do
            assert pool.orphans == {} and pool.orphans_closed == 1 and transport.lost == 2
            # the server refuses a client-chosen id that a live session has, and a malformed one
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://localhost") as c:
                body = {"env_id": ECHO, "session_id": "a" * 32}
                assert (await c.post("/sessions", json=body)).status_code == 201
                again = await c.post("/sessions", json=body)
                assert again.status_code == 409 and again.json()["code"] == "session_exists"
                assert (await c.post("/sessions", json={"env_id": ECHO, "session_id": "x/y"})).status_code == 422
                assert (await c.delete("/sessions/" + "a" * 32)).status_code == 204
    asyncio.run(main())
