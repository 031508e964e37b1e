"""``scripts/check_compose.sh`` end to end (builds both images, starts them, expert/oracle panel, 2 training steps):
minutes of CPU, so it runs only when asked (``AGENT_RL_COMPOSE_CHECK=1``) on a machine with a working engine
(``docker compose`` v2 with a daemon, or podman + podman-compose); otherwise it is skipped with the reason."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _engine() -> str | None:
    """The compose command that works here, or None."""
    def ok(*cmd: str) -> bool:
        try:
            return subprocess.run(cmd, capture_output=True, timeout=60).returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            return False

    if shutil.which("docker") and ok("docker", "compose", "version") and ok("docker", "info"):
        return "docker compose"
    if shutil.which("podman-compose") and shutil.which("podman") and ok("podman", "info"):
        return "podman-compose"
    return None


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("AGENT_RL_COMPOSE_CHECK") != "1",
                    reason="image builds take minutes: set AGENT_RL_COMPOSE_CHECK=1 to run scripts/check_compose.sh")
def test_check_compose_script_passes():
    engine = _engine()
    if engine is None:
        pytest.skip("no container engine: need docker compose v2 with a daemon, or podman + podman-compose")
    env = {**os.environ, "COMPOSE": engine, "PYTHON": sys.executable}
    run = subprocess.run(["bash", str(ROOT / "scripts" / "check_compose.sh")], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=3600)
    last = run.stdout.strip().splitlines()[-1] if run.stdout.strip() else ""
    assert run.returncode == 0 and last.startswith("compose ok:"), run.stdout[-3000:] + run.stderr[-3000:]
