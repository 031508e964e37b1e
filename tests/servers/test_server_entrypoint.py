"""The real entry point, ``python -m servers.serve``, under uvicorn on 127.0.0.1 (random free port): a user's
module served with ``--import``, the token, graceful shutdown, and the ALFWorld expert winning a game over HTTP
with the exact command of docker-compose's ``alfworld`` service."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from servers_helpers import CALC, ECHO, free_port, wait_healthy
from waiting import HANG_S

from agent_rl.envclient import EnvClientError, HTTPEnvPool

pytestmark = pytest.mark.slow  # end to end: env server processes (fast tier: pytest -m 'not slow')

ROOT = Path(__file__).resolve().parents[2]


def start_server(args: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
    environ = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), str(ROOT)]),
               "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.Popen([sys.executable, "-m", "servers.serve", *args], cwd=ROOT, env=environ,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def stop_server(proc: subprocess.Popen) -> tuple[int, str]:
    """SIGTERM (what ``docker stop`` sends) and wait for the graceful shutdown. uvicorn re-raises the signal once
    it has shut down, so a clean exit is ``-SIGTERM`` (or 0)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        out, _ = proc.communicate(timeout=HANG_S)  # a process start on a busy machine; the ceiling: a hang
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
    return proc.returncode, out


def test_serve_cli_serves_a_user_module_with_a_token():
    port = free_port()
    proc = start_server(["--import", "user_env_module", "--env", ECHO, "--env", CALC, "--port", str(port),
                         "--token", "t0k", "--max-sessions", "4"])
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc=proc)

        async def main():
            async with HTTPEnvPool(url, token="t0k") as pool:
                r = await pool.reset(ECHO, env_kwargs={"prefix": "user"})
                assert r.observation == "user: ready"
                s = await pool.step(r.session_id, "stop")
                assert (s.observation, s.reward, s.terminated) == ("user: stop", 1.0, True)
                c = await pool.reset(CALC, options={"index": 0})
                assert (await pool.step(c.session_id, "answer[215]")).reward == 1.0
            async with HTTPEnvPool(url, token="wrong") as pool:
                with pytest.raises(EnvClientError) as info:
                    await pool.reset(ECHO)
                assert info.value.status == 401

        asyncio.run(main())
    finally:
        code, out = stop_server(proc)
    assert code in (0, -signal.SIGTERM), out
    assert "Application shutdown complete" in out


def test_serve_cli_rejects_an_unknown_env_id():
    proc = start_server(["--env", "agent_rl/NoSuch-v0", "--port", str(free_port())])
    out, _ = proc.communicate(timeout=HANG_S)  # a process start on a busy machine; the ceiling: a hang
    assert proc.returncode != 0
    assert "unknown env ids ['agent_rl/NoSuch-v0']" in out and "agent_rl/Calculator-v0" in out


@pytest.mark.parametrize("args, message", [
    (["--env", CALC, "--import", "no_such_module_xyz"], "error: No module named 'no_such_module_xyz'"),
    (["--env", CALC, "--max-sessions", "0"], "error: invalid server settings: max_sessions=0"),
    (["--env", CALC, "--ttl", "-1"], "error: invalid server settings: session_ttl_s=-1.0"),
    (["--env", "agent_rl/NoSuch-v0"], "error: unknown env ids ['agent_rl/NoSuch-v0']"),
])
def test_serve_cli_bad_arguments_are_one_usage_error(args, message):
    # exit code 2 with argparse's one-line error before anything starts, not a traceback or a failed startup
    proc = start_server([*args, "--port", str(free_port())])
    out, _ = proc.communicate(timeout=HANG_S)  # a process start on a busy machine; the ceiling: a hang
    assert proc.returncode == 2, out
    assert message in out and "Traceback" not in out


@pytest.mark.slow
def test_alfworld_expert_wins_over_http_with_the_compose_command(require_alfworld):
    command = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]["alfworld"]["command"]
    assert command[:3] == ["python", "-m", "servers.serve"]
    args = list(command[3:])
    port = free_port()
    args[args.index("--host") + 1] = "127.0.0.1"
    args[args.index("--port") + 1] = str(port)
    proc = start_server(args)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc=proc)

        async def main():
            async with HTTPEnvPool(url) as pool:
                r = await pool.reset("agent_rl/ALFWorld-v0", options={"split": "valid_unseen", "index": 0},
                                     env_kwargs={"expert": True})
                info, steps = r.info, 0
                assert info["task_type"] and info["admissible_actions"]
                while True:
                    s = await pool.step(r.session_id, info["expert_action"])
                    info, steps = s.info, steps + 1
                    if s.terminated or s.truncated:
                        break
                assert (s.reward, s.terminated, info["won"]) == (1.0, True, True)
                assert steps < 50

        asyncio.run(main())
    finally:
        code, out = stop_server(proc)
    assert code in (0, -signal.SIGTERM) and "Application shutdown complete" in out, out
