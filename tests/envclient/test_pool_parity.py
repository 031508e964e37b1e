"""``HTTPEnvPool`` and ``LocalEnvPool`` (threads and worker processes) raise the same client error class, with the
same code, for the same situation: both run the one session state machine of ``envs.hosting``, and the local pool
maps its errors with the rule the HTTP pool applies to the server's status codes."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

pytestmark = pytest.mark.slow  # end to end: env server processes (fast tier: pytest -m 'not slow')

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "servers"))  # user_env_module, servers_helpers

from servers_helpers import CALC, ECHO, make_app, serve_asgi  # noqa: E402

from agent_rl.envclient import (  # noqa: E402
    EnvClientError,
    EnvServerError,
    EnvUnavailable,
    EpisodeOver,
    HTTPEnvPool,
    LocalEnvPool,
    SessionBusy,
    SessionNotFound,
)
from envs.hosting import SessionManager  # noqa: E402
from servers.access import scoped  # noqa: E402
from servers.tokens import LOCAL_CLIENT  # noqa: E402

KINDS = ["http", "thread", "process"]


@contextlib.asynccontextmanager
async def open_pool(kind: str, max_sessions: int = 8) -> AsyncIterator[tuple[object, SessionManager]]:
    """The pool under test and the session manager behind it (the server's, or the local pool's own)."""
    if kind == "http":
        app = make_app(max_sessions=max_sessions)
        async with serve_asgi(app):
            async with HTTPEnvPool("http://localhost", transport=httpx.ASGITransport(app=app), retries=0) as pool:
                yield pool, app.state.manager
    else:
        async with LocalEnvPool(max_workers=2, mode=kind, max_sessions=max_sessions,
                                imports=["user_env_module"]) as pool:
            yield pool, pool.manager


def error_of(excinfo: pytest.ExceptionInfo) -> tuple[str, str | None]:
    return type(excinfo.value).__name__, excinfo.value.code


@pytest.mark.parametrize("kind", KINDS)
def test_same_error_for_the_same_situation(kind):
    async def main() -> list[tuple[str, str | None]]:
        seen = []
        async with open_pool(kind) as (pool, manager):
            # step after the episode ended
            r = await pool.reset(CALC, options={"index": 0})
            assert (await pool.step(r.session_id, "answer[215]")).terminated
            with pytest.raises(EpisodeOver) as info:
                await pool.step(r.session_id, "answer[215]")
            seen.append(error_of(info))
            await pool.close(r.session_id)
            # unknown (here: closed) session
            with pytest.raises(SessionNotFound) as info:
                await pool.step(r.session_id, "calc[1]")
            seen.append(error_of(info))
            # a second step on a session whose first step is still running
            r = await pool.reset(ECHO)
            slow = asyncio.create_task(pool.step(r.session_id, "sleep:3"))
            # the server keys a client's session in the client's namespace (servers.access.scoped)
            session = manager.sessions.get(r.session_id) or manager.sessions[scoped(LOCAL_CLIENT, r.session_id)]
            for _ in range(2000):  # wait until the first step holds the session (no wall-clock assumption)
                if session.busy:
                    break
                await asyncio.sleep(0.005)
            assert session.busy
            with pytest.raises(SessionBusy) as info:
                await pool.step(r.session_id, "x")
            seen.append(error_of(info))
            assert (await slow).observation == "echo: sleep:3"  # the running step was not disturbed
            # the env raises: the session is closed
            with pytest.raises(EnvServerError) as info:
                await pool.step(r.session_id, "raise")
            seen.append(error_of(info))
            with pytest.raises(SessionNotFound):
                await pool.step(r.session_id, "x")
            # the env could not judge
            r = await pool.reset(ECHO)
            with pytest.raises(EnvServerError) as info:
                await pool.step(r.session_id, "infra")
            seen.append(error_of(info))
            # unknown env id; reset options the env rejects: the client's error, not the server's
            for call in (pool.reset("user/NoSuchEnv-v0"), pool.reset(ECHO, options={"raise": "IndexError"})):
                with pytest.raises(EnvClientError) as info:
                    await call
                assert not isinstance(info.value, (EnvServerError, EnvUnavailable, SessionNotFound))
                seen.append(error_of(info))
            assert manager.sessions == {}
        return seen

    seen = asyncio.run(main())
    # HTTPEnvPool knows a closed session itself (no request is sent, no server code): compare its class only
    assert seen[1][0] == "SessionNotFound" and seen[1][1] in (None, "session_not_found")
    assert seen[:1] + seen[2:] == [
        ("EpisodeOver", "episode_over"),
        ("SessionBusy", "session_busy"),
        ("EnvServerError", "env_error"),
        ("EnvServerError", "env_infra_error"),
        ("EnvClientError", "unknown_env"),
        ("EnvClientError", "invalid_request"),
    ]


@pytest.mark.parametrize("kind", KINDS)
def test_same_error_at_capacity(kind):
    async def main() -> None:
        async with open_pool(kind, max_sessions=1) as (pool, _):
            first = await pool.reset(ECHO)
            with pytest.raises(EnvUnavailable) as info:
                await pool.reset(ECHO)
            assert info.value.code == "at_capacity"
            await pool.close(first.session_id)
            await pool.close((await pool.reset(ECHO)).session_id)  # the freed slot is usable again

    asyncio.run(main())
