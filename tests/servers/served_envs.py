"""Real env servers (``python -m servers.serve``, the entry point the images run) for the tests that play ALFWorld
and WebShop through the OpenEnv and MCP surfaces (the fixtures are in this folder's conftest)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from servers.launch import TOKEN_ENV
from servers_helpers import free_port, wait_healthy

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "tok-3f9a"  # the shared servers run with a token: every test through them checks that it works


def start_server(env_ids: list[str], extra: list[str], log: Path, token: str | None = TOKEN
                 ) -> tuple[subprocess.Popen, str]:
    """``python -m servers.serve`` on a free loopback port, healthy; ``(process, url)``."""
    port = free_port()
    cmd = [sys.executable, "-m", "servers.serve", "--host", "127.0.0.1", "--port", str(port), "--log-level",
           "warning", *[a for e in env_ids for a in ("--env", e)], *extra]
    env = {**{k: v for k, v in os.environ.items() if k != TOKEN_ENV},
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), str(ROOT)]), "OMP_NUM_THREADS": "1"}
    if token:  # in the environment, as every launcher passes it (never on the command line)
        env[TOKEN_ENV] = token
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_healthy(f"http://127.0.0.1:{port}", timeout_s=300, proc=proc)
    except BaseException:
        proc.kill()
        raise
    return proc, f"http://127.0.0.1:{port}"


