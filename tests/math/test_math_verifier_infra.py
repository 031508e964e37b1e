"""Issue 10, section 1, for Math-v0: a verifier that cannot judge at all raises ``EnvInfraError`` (never a reward);
an answer that the verifier cannot judge (timeout, crash on that answer) is still the answer's problem.

The failures are simulated with fake worker interpreters (small shell scripts in place of ``python``)."""

from __future__ import annotations

import stat
import sys
from pathlib import Path

import pytest

from envs.errors import EnvInfraError
from envs.math import MathEnv, VerifierPool, score_response


def fake_python(tmp_path: Path, body: str) -> str:
    path = tmp_path / "fake-python"
    path.write_text("#!/bin/bash\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def test_missing_interpreter_is_infra_error():
    pool = VerifierPool(n_workers=1, timeout_s=2.0, python="/nonexistent/python3")
    with pytest.raises(EnvInfraError, match="/nonexistent/python3") as info:
        pool.check("1", "1")
    assert info.value.component == "verifier"


def test_math_env_step_raises_instead_of_string_fallback():
    # Issue 10: before, a dead verifier meant (None, "error: ...") and the string fallback scored the answer.
    env = MathEnv(datasets="math500")
    env.pool = VerifierPool(n_workers=1, timeout_s=2.0, python="/nonexistent/python3")
    env.reset(options={"index": 0})
    with pytest.raises(EnvInfraError):
        env.step("\\boxed{3}")


def test_verifier_that_answers_nothing_is_infra_not_timeout(tmp_path):
    # The warm-up is answered, then the worker hangs: it cannot answer 1 == 1 within timeout_s.
    script = fake_python(tmp_path, 'read line; echo "[true, null]"; read line; exec sleep 100\n')
    pool = VerifierPool(n_workers=1, timeout_s=0.5, python=script)
    try:
        with pytest.raises(EnvInfraError, match="trivial check"):
            score_response("1", "\\boxed{1}", pool)
    finally:
        pool.close()


def test_worker_crash_is_retried_on_a_fresh_worker(tmp_path):
    # The first worker dies under the first real check (an OOM kill, say); the retry on a fresh worker judges it.
    marker = tmp_path / "crashed-once"
    script = fake_python(tmp_path, (
        f'if [ ! -e {marker} ]; then read a; echo "[true, null]"; read b; echo "[true, null]"; read c; '
        f'touch {marker}; exit 1; fi\n'
        f'exec {sys.executable} "$@"\n'))
    pool = VerifierPool(n_workers=1, timeout_s=5.0, python=script)
    try:
        assert score_response("\\frac{1}{2}", "\\boxed{0.5}", pool)["reward"] == 1.0
        assert score_response("\\frac{1}{2}", "\\boxed{0.6}", pool)["reward"] == 0.0
        assert marker.exists()
    finally:
        pool.close()


def test_answer_timeout_with_healthy_verifier_is_the_answers(tmp_path):
    # The answer hangs its worker (simulated: the first worker sleeps on its first real check); a fresh worker then
    # answers 1 == 1, so the verifier is healthy: reason "timeout" and the string fallback (0.0 here).
    marker = tmp_path / "slow-once"
    script = fake_python(tmp_path, (
        f'if [ ! -e {marker} ]; then read a; echo "[true, null]"; read b; echo "[true, null]"; read c; '
        f'touch {marker}; exec sleep 100; fi\n'
        f'exec {sys.executable} "$@"\n'))
    pool = VerifierPool(n_workers=1, timeout_s=1.0, python=script)
    try:
        out = score_response("2", "\\boxed{3}", pool)
        assert (out["reward"], out["verifier"]) == (0.0, "timeout")
        assert pool.n_killed == 1
    finally:
        pool.close()
