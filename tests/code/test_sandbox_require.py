"""``AGENT_RL_SANDBOX_REQUIRE=full`` turns a sandbox test that this machine's isolation cannot run into a failure
(CI), where it would otherwise be a skip with the level found. Checked on an inner pytest run of the real conftest
(``tests/code/conftest.py``) with the level forced by ``AGENT_RL_SANDBOX``."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # runs pytest in subprocesses (fast tier: pytest -m 'not slow')

INNER = '''
import pytest

@pytest.mark.sandbox("full")
def test_needs_full():
    pass

@pytest.mark.sandbox("namespaces")
def test_needs_namespaces():
    pass

def test_plain():
    pass
'''


def inner_run(tmp_path: Path, level: str, require: str | None) -> tuple[int, str]:
    shutil.copy(Path(__file__).with_name("conftest.py"), tmp_path / "conftest.py")
    (tmp_path / "test_inner.py").write_text(INNER)
    env = {k: v for k, v in os.environ.items() if k != "AGENT_RL_SANDBOX_REQUIRE"}
    env["AGENT_RL_SANDBOX"] = level
    if require is not None:
        env["AGENT_RL_SANDBOX_REQUIRE"] = require
    done = subprocess.run([sys.executable, "-m", "pytest", "-rA", "-p", "no:cacheprovider", str(tmp_path)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    return done.returncode, done.stdout + done.stderr


def test_without_requirement_lower_levels_skip_with_the_level(tmp_path):
    code, out = inner_run(tmp_path, "none", None)
    assert code == 0 and "1 passed, 2 skipped" in out, out
    assert "needs code-sandbox isolation 'full', this machine gives 'none'" in out


def test_require_full_turns_every_skip_into_a_failure(tmp_path):
    code, out = inner_run(tmp_path, "none", "full")
    assert code == 1 and "2 failed, 1 passed" in out, out
    assert out.count("(AGENT_RL_SANDBOX_REQUIRE=full)") >= 2


def test_require_full_fails_userns_only_where_full_is_needed(tmp_path):
    code, out = inner_run(tmp_path, "userns", "full")
    assert code == 1 and "1 failed, 2 passed" in out, out
    assert "FAILED test_inner.py::test_needs_full" in out


def test_require_with_another_value_is_a_usage_error(tmp_path):
    code, out = inner_run(tmp_path, "none", "yes")
    assert code == pytest.ExitCode.USAGE_ERROR and "AGENT_RL_SANDBOX_REQUIRE must be 'full' or unset" in out, out
