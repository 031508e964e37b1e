"""End to end on real ALFWorld games: the documented acceptance command starts the ALFWorld server itself, writes
metrics.jsonl and a checkpoint, and ``trainer.resume=auto trainer.total_steps=3`` resumes at step 3.

One tiny run (ALFWorld resets cost ~3 s): 1 task x 4 episodes x 3 turns x 16 tokens per step, tiny model.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agent_rl.logging import SECTION6_METRICS, read_metrics

REPO = Path(__file__).resolve().parents[2]
CMD = [sys.executable, "-m", "agent_rl.train", "env=alfworld", "algo=tgrl", "model=tiny", "trainer.tasks_per_step=1",
       "rollout.max_turns=3", "engine.max_new_tokens=16", "trainer.progress=false",
       "trainer=default"]  # trainer=default: no CPU preset (its eval panels would add minutes)


@pytest.mark.slow
def test_alfworld_train_then_resume(tmp_path, require_alfworld):
    out = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    first = subprocess.run([*CMD, "trainer.total_steps=2", f"trainer.output_dir={out}"], cwd=REPO, env=env,
                           capture_output=True, text=True, timeout=900)
    assert first.returncode == 0, first.stderr[-4000:]
    recs = read_metrics(out / "metrics.jsonl", "train")
    assert [r["step"] for r in recs] == [1, 2]
    for rec in recs:
        assert all(name in rec for name in SECTION6_METRICS)
        assert rec["episode/turns_mean"] is not None and 1 <= rec["episode/turns_mean"] <= 3
        assert rec["actor/pg_loss"] is not None and rec["rollout/dropped_groups"] == 0
    assert (out / "checkpoints" / "step_2" / "extra.json").is_file()
    assert "env server agent_rl/ALFWorld-v0 at http://127.0.0.1:" in first.stderr  # started by the command itself

    second = subprocess.run([*CMD, "trainer.total_steps=3", "trainer.resume=auto", f"trainer.output_dir={out}"],
                            cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert second.returncode == 0, second.stderr[-4000:]
    assert "at step 3" in second.stderr
    steps = [r["step"] for r in read_metrics(out / "metrics.jsonl", "train")]
    assert steps == [1, 2, 3]
    extra = json.loads((out / "checkpoints" / "step_3" / "extra.json").read_text())
    assert extra["step"] == 3 and extra["sampler"] == {"position": 3}
