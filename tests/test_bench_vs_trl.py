"""``benchmarks/bench_vs_trl.py``'s plumbing with ``--model tiny --steps 1``: results.json has, per side, the step,
generation and update seconds and the peak memory, and the step ratio; the TRL side runs where an interpreter has
``trl`` (this one, or ``$AGENT_RL_TRL_PYTHON``: TRL lives in a venv of its own), else it is skipped with the reason.
TRL is never imported by the package."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SIDE_KEYS = ("step_s", "generate_s", "update_s", "peak_rss_gb")


def _trl_python() -> str | None:
    for py in (os.environ.get("AGENT_RL_TRL_PYTHON"), sys.executable):
        if py and subprocess.run([py, "-c", "import trl"], capture_output=True).returncode == 0:
            return py
    return None


def _run(tmp_path: Path, *extra: str) -> tuple[subprocess.CompletedProcess, dict]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "benchmarks/bench_vs_trl.py", "--model", "tiny", "--steps", "1",
                           "--max-new-tokens", "6", "--threads", "1", "--out", str(tmp_path), *extra],
                          cwd=REPO, capture_output=True, text=True, timeout=1500, env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return proc, json.loads((tmp_path / "results.json").read_text())


def test_engine_dtypes_name_the_sides():
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        from bench_vs_trl import agent_rl_sides
    finally:
        sys.path.pop(0)
    assert agent_rl_sides("float32,bfloat16") == {"agent_rl": "", "agent_rl_bfloat16": "bfloat16"}
    assert agent_rl_sides("bfloat16") == {"agent_rl_bfloat16": "bfloat16"}
    for bad in ("int8", " , "):
        with pytest.raises(SystemExit):
            agent_rl_sides(bad)


def test_the_package_never_imports_trl():
    pattern = re.compile(r"^\s*(import trl\b|from trl\b)", re.M)
    offenders = [str(p) for p in (REPO / "agent_rl").rglob("*.py") if pattern.search(p.read_text())]
    assert offenders == []


@pytest.mark.timeout(1500)
def test_agent_rl_side_alone_where_trl_is_absent(tmp_path):
    """An interpreter without trl: the agent_rl side is measured and the TRL side is skipped with the reason."""
    no_trl = sys.executable if _trl_python() != sys.executable else None
    if no_trl is None:
        pytest.skip("this interpreter has trl: the TRL-less path is not reachable here")
    _, res = _run(tmp_path, "--trl-python", no_trl, "--engine-dtypes", "float32,bfloat16")
    a = res["agent_rl"]
    for key in SIDE_KEYS:
        assert a[key] is not None and a[key] > 0, key
    assert a["step_s"] >= a["update_s"] and a["step_s"] >= a["generate_s"]
    assert abs(a["step_s"] - a["generate_s"] - a["update_s"]) < 1e-6
    step = a["runs"][0]["steps"][0]
    assert step["single_pass"] == 1.0 and step["grad_norm"] > 0  # the signal reward: the update ran
    assert 0 < step["tokens"] <= 16 * 6
    assert a["tokens_per_cpu_s"] == pytest.approx(
        step["tokens"] / step["generate_cpu_s"], rel=1e-9)  # measured over generation and reward
    # the bfloat16 engine side: same prompts and shape, its own engine precision; the learner's float32 log-probs
    # differ from its engine's by bfloat16's rounding, and from the shared float32 module's by float noise only
    b = res["agent_rl_bfloat16"]["runs"][0]["steps"][0]
    assert res["engine_dtypes"] == {"agent_rl": "float32 (the learner's module)", "agent_rl_bfloat16": "bfloat16"}
    assert b["single_pass"] == 1.0 and b["grad_norm"] > 0 and 0 < b["tokens"] <= 16 * 6
    assert step["engine_logprob_diff"] < 1e-4 < b["engine_logprob_diff"] < 0.5, (step, b)
    assert "trl" in res["trl"]["skipped"] and res["ratio_step"] is None
    assert res["prompt_ids_checked"] is True and len(res["load_before"]) == 3 == len(res["load_after"])


@pytest.mark.timeout(1500)
def test_both_sides_and_the_ratio(tmp_path):
    """Both sides, one step each on the tiny model: every field, the prompt ids equal, ratio_step = A / B."""
    py = _trl_python()
    if py is None:
        pytest.skip("TRL is not installed (pip install 'agent_rl[bench-trl]' in a venv of its own, then "
                    "AGENT_RL_TRL_PYTHON=that venv's python)")
    _, res = _run(tmp_path, "--trl-python", py)
    for side in ("agent_rl", "trl"):
        for key in SIDE_KEYS:
            assert res[side][key] is not None and res[side][key] > 0, (side, key)
        assert res[side]["tokens"] > 0
    assert res["ratio_step"] == pytest.approx(res["agent_rl"]["step_s"] / res["trl"]["step_s"], rel=1e-9)
    assert res["ratio_step_spread"][0] <= res["ratio_step"] <= res["ratio_step_spread"][1]
    assert res["prompt_ids_checked"] is True
    assert res["multi_turn"]["trl"]["supported"] in (True, False)
    if not res["multi_turn"]["trl"]["supported"]:
        assert "tool" in res["multi_turn"]["trl"]["reason"]
