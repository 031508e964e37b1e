"""Every subprocess the project starts runs in a process group of its own and is ended with it: a helper an env, a
sandboxed program or a server started in the background is gone once its owner's timeout or close ends the owner.
Checked by pid (a helper left running, or a zombie nobody reaps, counts as alive only in the first case): env worker
processes (``envs.hosting``: a step's timeout, the pool's close), the run's env server (``EnvServerProcess``: its
stop, also after the server died), the code sandbox without namespaces, the math verifier."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # user_env_module

from envs.hosting.errors import EnvTimeout  # noqa: E402
from envs.hosting.pool import WorkerPool  # noqa: E402


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _gone(pid: int, within_s: float = 20.0) -> bool:
    deadline = time.monotonic() + within_s
    while _alive(pid):
        if time.monotonic() > deadline:
            psutil.Process(pid).kill()  # leave nothing behind, then fail
            return False
        time.sleep(0.05)
    return True


def test_a_worker_that_times_out_takes_the_helper_its_env_started(tmp_path):
    pid_file = tmp_path / "child.pid"

    async def main() -> int:
        pool = WorkerPool(1, imports=["user_env_module"], timeout_s=3.0)
        try:
            await pool.open("a", "user/Echo-v0")
            worker = pool.pid_of("a")
            assert os.getpgid(worker) == worker  # a group of its own
            with pytest.raises(EnvTimeout):
                await pool.step("a", f"spawn:{pid_file}")
            return worker
        finally:
            await pool.aclose()

    worker = asyncio.run(main())
    child = int(pid_file.read_text())
    assert _gone(worker) and _gone(child)  # before: the helper ran on (600 s) after its worker was killed


def test_closing_the_pool_takes_the_helpers_of_its_envs():
    async def main() -> tuple[int, int]:
        pool = WorkerPool(2, imports=["user_env_module"])
        try:
            await pool.open("a", "user/Echo-v0")
            reply = await pool.step("a", "spawn")
            child = reply[4]["child"] if isinstance(reply, tuple) else reply.info["child"]
            assert _alive(child)
            return pool.pid_of("a"), child
        finally:
            await pool.aclose()

    worker, child = asyncio.run(main())
    assert _gone(worker) and _gone(child)


@pytest.mark.parametrize("crash", [False, True])
def test_the_run_env_server_is_ended_with_its_group(tmp_path, crash):
    """The run's env server (EnvServerProcess) serving the Echo env: a session's env leaves a helper running; the
    server's stop (the end of the run), or its crash (SIGKILL) then stop, leaves none of its processes behind."""
    from agent_rl.config.compose import load_config
    from agent_rl.runtime import EnvServerProcess
    from servers.launch import ServerLaunch

    cfg = load_config(["env=choose_item", "model=tiny", "env_server.workers=1", "env_server.max_sessions=4"])
    server = EnvServerProcess(cfg, tmp_path / "server.log")
    launch = ServerLaunch(["user/Echo-v0"], server.port, server.token, imports=["user_env_module"], workers=1,
                          max_sessions=4, pythonpath=f"{server.repo}:{HERE}")
    server.cmd, server.env = launch.command, launch.environment()
    server.start()
    try:
        headers = {"Authorization": f"Bearer {server.token}"}
        opened = httpx.post(server.url + "/sessions", json={"env_id": "user/Echo-v0"}, headers=headers, timeout=60)
        assert opened.status_code == 201, opened.text
        sid = opened.json()["session_id"]
        step = httpx.post(f"{server.url}/sessions/{sid}/step", json={"action": "spawn"}, headers=headers, timeout=60)
        child = step.json()["info"]["child"]
        family = [p.pid for p in psutil.Process(server.proc.pid).children(recursive=True)]
        assert child in family and _alive(child)
        if crash:
            server.proc.kill()
            server.proc.wait(10)
    finally:
        server.stop()
    assert all(_gone(pid) for pid in [server.proc.pid, *family])


def test_a_sandboxed_program_without_namespaces_leaves_no_helper(tmp_path, monkeypatch):
    """Isolation ``none``: a program that starts a background helper (in its group) and exits by itself."""
    from envs.code import run_tests
    from envs.code.sandbox import isolation_level

    monkeypatch.setenv("AGENT_RL_SANDBOX", "none")
    isolation_level.cache_clear()
    pid_file = tmp_path / "helper.pid"
    program = (f"import subprocess, sys\n"
               f"p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
               f"open({str(pid_file)!r}, 'w').write(str(p.pid))\n"
               f"import os\nos._exit(0)\n")
    try:
        result = run_tests(program, {"mode": "asserts", "setup": "", "asserts": ["assert f(1) == 2"]})
    finally:
        isolation_level.cache_clear()
    assert result.isolation == "none"
    helper = int(pid_file.read_text())
    assert _gone(helper)  # before: the helper outlived the run (the group was killed only if the program ran on)


def test_the_math_verifier_is_ended_with_its_group(tmp_path):
    """The verifier's interpreter started through a wrapper that leaves a helper running (in its group)."""
    from envs.math.pool import _Worker

    pid_file = tmp_path / "helper.pid"
    wrapper = tmp_path / "python"
    wrapper.write_text(f"#!/bin/sh\n{sys.executable} -c 'import time; time.sleep(600)' &\necho $! > {pid_file}\n"
                       f"exec {sys.executable} \"$@\"\n")
    wrapper.chmod(0o755)
    worker = _Worker(5, python=str(wrapper))
    try:
        assert os.getpgid(worker.process.pid) == worker.process.pid
        deadline = time.monotonic() + 20
        while not pid_file.is_file() or not pid_file.read_text().strip():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        helper = int(pid_file.read_text())
        assert _alive(helper)
    finally:
        worker.kill()
    assert _gone(worker.process.pid) and _gone(helper)


def test_a_vllm_server_that_exits_while_starting_leaves_no_helper(tmp_path):
    """The vllm_server engine's server process (``ServerProcess``), its command standing in for ``vllm serve``: a
    server that starts a helper (an engine core) and dies before it is healthy; the start's error ends its group."""
    from agent_rl.engines.vllm_server import ServerProcess
    from servers.launch import free_port

    pid_file = tmp_path / "helper.pid"
    script = (f"import subprocess, sys, time\n"
              f"p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
              f"open({str(pid_file)!r}, 'w').write(str(p.pid))\n"
              f"time.sleep(0.5)\nsys.exit(3)\n")
    server = ServerProcess([sys.executable, "-c", script], dict(os.environ), f"http://127.0.0.1:{free_port()}",
                           tmp_path / "vllm.log")
    server.launch()
    with pytest.raises(RuntimeError, match="exited with code 3 while starting"):
        server.wait_ready(60)
    assert os.getpgid(os.getpid()) != server.proc.pid and _gone(int(pid_file.read_text()))


@pytest.mark.parametrize("hang", [True, False])
def test_run_ends_the_group_on_timeout_and_after_exit(tmp_path, hang):
    """``envs.procgroup.run`` (the code sandbox's probes): a command that leaves a helper running, and either hangs
    past its timeout or exits; the helper is gone either way, and the timeout comes back within seconds (with
    ``subprocess.run`` it waited for the helper's pipes: 600 s)."""
    import subprocess

    from envs.procgroup import run

    pid_file = tmp_path / "helper.pid"
    script = (f"import subprocess, sys, time\n"
              f"p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
              f"open({str(pid_file)!r}, 'w').write(str(p.pid))\n"
              f"print('started', flush=True)\n"
              f"time.sleep({600 if hang else 0})\n")
    started = time.monotonic()
    if hang:
        with pytest.raises(subprocess.TimeoutExpired):
            run([sys.executable, "-c", script], timeout=5, capture_output=True, text=True)
    else:
        done = run([sys.executable, "-c", script], timeout=60, capture_output=True, text=True)
        assert (done.returncode, done.stdout) == (0, "started\n")
    assert time.monotonic() - started < 120 and _gone(int(pid_file.read_text()))
