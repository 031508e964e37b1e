"""``scripts/test_under_load.sh``: pytest beside N busy loops; its exit status is pytest's, it prints pytest's summary
line and the wall time, and no busy loop outlives it (run here on a one-test file, beside one loop)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # a pytest process of its own per case (fast tier: pytest -m 'not slow')

REPO = Path(__file__).resolve().parents[1]


def _run(tmp_path: Path, body: str, *args: str) -> subprocess.CompletedProcess:
    test = tmp_path / "test_one.py"
    test.write_text(f"def test_one():\n    {body}\n")
    env = {**os.environ, "PYTHON": sys.executable, "TMPDIR": str(tmp_path)}
    return subprocess.run(["bash", str(REPO / "scripts" / "test_under_load.sh"), *args, "-p", "no:cacheprovider",
                           str(test)], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)


def _loops_gone(stdout: str, count: int) -> None:
    pids = [int(p) for p in re.search(r"\(pids ([\d ]+)\)", stdout).group(1).split()]
    assert len(pids) == count
    for pid in pids:  # killed and reaped by the script: no such process (or a pid reused by another program)
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except FileNotFoundError:
            continue
        assert not cmdline.startswith(b"yes"), f"busy loop {pid} outlived the script"


@pytest.mark.parametrize("body, status, summary", [("assert 1 + 1 == 2", 0, "1 passed"),
                                                   ("assert 1 + 1 == 3", 1, "1 failed")])
def test_status_summary_and_wall_time_with_the_loops_killed(tmp_path, body, status, summary):
    done = _run(tmp_path, body, "1")
    assert done.returncode == status, done.stdout + done.stderr
    assert "test_under_load: 1 busy loop(s)" in done.stdout
    assert re.search(rf"test_under_load: summary: {summary} in [\d.]+s", done.stdout), done.stdout
    assert re.search(rf"test_under_load: wall \d+ s \(\d+ min \d+ s\) beside 1 busy loop\(s\); pytest exit {status}",
                     done.stdout), done.stdout
    _loops_gone(done.stdout, 1)


def test_a_bad_n_from_the_environment_is_refused():
    done = subprocess.run(["bash", str(REPO / "scripts" / "test_under_load.sh")], cwd=REPO,
                          env={**os.environ, "N": "two", "PYTHON": sys.executable}, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2 and "N must be a whole number of busy loops, got 'two'" in done.stderr
