"""The trainer's auto-started env server (``env_server.urls`` empty): killed with SIGKILL, it is started again on the
same URL; once ``env_server.max_restarts`` is used up the run stops with a ``RuntimeError`` naming the cause, within
seconds (never a run that hangs or trains on nothing)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from pathlib import Path

import httpx
import pytest

from agent_rl import runtime
from agent_rl.config.compose import load_config
from agent_rl.runtime import EnvServerProcess, env_server, open_env_pool, supervise_env_server
from waiting import HANG_S

pytestmark = pytest.mark.slow  # end to end: env server processes (fast tier: pytest -m 'not slow')

BASE = ["env=choose_item", "model=tiny", "env_server.workers=1", "env_server.max_sessions=4"]


def test_killed_server_is_restarted_on_the_same_url_then_given_up(tmp_path: Path) -> None:
    cfg = load_config([*BASE, "env_server.max_restarts=1"])
    failures: list[str] = []

    async def main() -> None:
        with env_server(cfg, tmp_path / "server.log") as server:
            assert isinstance(server, EnvServerProcess)
            first_pid = server.proc.pid
            # a token made for the run (no env_server.token), in the child's environment, not on its command line
            assert server.token and server.token.encode() not in Path(f"/proc/{first_pid}/cmdline").read_bytes()
            assert httpx.get(server.url + "/sessions", timeout=HANG_S).status_code == 401
            assert httpx.get(server.url + "/sessions", timeout=HANG_S,
                             headers={"Authorization": f"Bearer {server.token}"}).status_code == 200
            watch = asyncio.create_task(supervise_env_server(server, lambda: failures.append("stop"),
                                                             interval_s=0.1))
            os.kill(first_pid, signal.SIGKILL)
            deadline = time.monotonic() + HANG_S  # the ceiling only catches a restart that never comes
            while server.starts < 2:  # restarted: start() returned, healthy
                assert time.monotonic() < deadline and not watch.done()
                await asyncio.sleep(0.1)
            assert server.proc.pid != first_pid and httpx.get(server.url + "/health", timeout=HANG_S).status_code == 200
            assert server.restarts == 1 and failures == []
            os.kill(server.proc.pid, signal.SIGKILL)  # the second death: max_restarts=1 is used up
            await asyncio.wait_for(watch, HANG_S)
            assert failures == ["stop"]
            assert "exited with code -9 after 1 restart(s) (env_server.max_restarts=1)" in server.failure

    asyncio.run(main())


def test_run_stops_with_the_reason_when_the_server_cannot_be_restarted(tmp_path: Path, monkeypatch) -> None:
    cfg = load_config([*BASE, "env_server.max_restarts=0"])
    started: list[EnvServerProcess] = []

    @contextlib.contextmanager
    def recording(*args):
        with env_server(*args) as server:
            started.append(server)
            yield server

    monkeypatch.setattr(runtime, "env_server", recording)

    async def main() -> None:
        async with open_env_pool(cfg, tmp_path) as pool:
            r = await pool.reset(cfg.env.id, seed=0)
            os.kill(started[0].proc.pid, signal.SIGKILL)
            with contextlib.suppress(Exception):
                await pool.step(r.session_id, "x")
            await asyncio.sleep(3600)  # a rollout waiting on the dead server: stopped by the supervisor

    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match=r"the env server .* exited with code -9 after 0 restart\(s\)"):
        asyncio.run(main())
    assert time.monotonic() - t0 < HANG_S  # stopped by the supervisor, not at the end of the rollout's hour
