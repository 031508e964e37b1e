"""The sandbox must work when the project's venv lives under /tmp (CI clones do): the sandbox's root has its own
tmpfs /tmp, and the venv is no part of it, so it runs the real base interpreter instead."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from envs.code import sandbox


def test_sandbox_python_resolves_links_out_of_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    link = tmp_path / "venv" / "bin" / "python"  # tmp_path is under /tmp: like a CI clone's .venv
    link.parent.mkdir(parents=True)
    real = os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)
    link.symlink_to(real)
    monkeypatch.setattr(sys, "executable", str(link))
    monkeypatch.setattr(sys, "_base_executable", str(link), raising=False)
    sandbox.sandbox_python.cache_clear()
    try:
        assert sandbox.sandbox_python() == real
        assert not any(real.startswith(d + "/") for d in sandbox.SANDBOX_DIRS)
        spec = {"mode": "asserts", "setup": "", "asserts": ["assert f(2) == 4", "assert f(3) == 10"]}
        result = sandbox.run_tests("def f(x):\n    return x * x\n", spec)
        assert result.checker_error is None, result.checker_error
        assert [t["passed"] for t in result.tests] == [True, False]
    finally:
        sandbox.sandbox_python.cache_clear()


def test_no_namespaces_is_said_out_loud(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Where the sandbox cannot isolate (here: no unshare on PATH), the level is "none" and a warning says what the
    # program can then reach; never a silent fallback.
    monkeypatch.delenv("AGENT_RL_SANDBOX", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    sandbox.isolation_level.cache_clear()
    try:
        with pytest.warns(RuntimeWarning, match="no namespace isolation here .*no unshare.*the benchmark included"):
            assert sandbox.isolation_level() == "none"
    finally:
        monkeypatch.undo()
        sandbox.isolation_level.cache_clear()
