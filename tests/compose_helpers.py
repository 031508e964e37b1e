"""The container engine the compose tests use, and what they do without one: skip with the reason on a developer's
machine; fail under ``AGENT_RL_COMPOSE_REQUIRED=1`` (CI, where ``.ci/run`` installed the engine)."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

#: set by CI: a missing or broken container engine fails the compose tests instead of skipping them
REQUIRED = os.environ.get("AGENT_RL_COMPOSE_REQUIRED") == "1"


def _ok(*cmd: str) -> bool:
    try:
        return subprocess.run(cmd, capture_output=True, timeout=60).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def find_engine() -> tuple[list[str] | None, str]:
    """(the compose command that works here, e.g. ``["podman-compose"]``, or None; why not, when None). The order is
    ``scripts/check_compose.sh``'s: Docker Compose v2 with a running daemon, else podman + podman-compose."""
    if shutil.which("docker") and _ok("docker", "compose", "version") and _ok("docker", "info"):
        return ["docker", "compose"], ""
    if shutil.which("podman-compose") and shutil.which("podman") and _ok("podman", "info"):
        return ["podman-compose"], ""
    return None, ("no container engine can run here: need 'docker compose' (v2) with a running Docker daemon, or "
                  "podman + podman-compose with a working 'podman info' (on the project's machines: "
                  "bash ../shared/tools/container-engine.sh, as root)")


def require_engine() -> list[str]:
    """The compose command; without one, skip (fail under ``AGENT_RL_COMPOSE_REQUIRED=1``) with the reason."""
    engine, why = find_engine()
    if engine is None:
        if REQUIRED:
            pytest.fail(f"AGENT_RL_COMPOSE_REQUIRED=1 but {why}")
        pytest.skip(why)
    return engine
