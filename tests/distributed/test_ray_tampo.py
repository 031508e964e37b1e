"""``algo=tampo`` on ``trainer.backend=ray``: the driver draws T and sends it with the tasks, the rollout workers
sample every episode of the step at it, the learner rank's ``tampo_sum/*`` reach the driver, and the local backend's
run is reproduced (same draws, same A_B, same meta state)."""

from __future__ import annotations

import json

import pytest

ray = pytest.importorskip("ray")

from agent_rl.logging import read_metrics  # noqa: E402
from agent_rl.train import main  # noqa: E402

pytestmark = pytest.mark.slow

TEMPS = [0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.2, 1.3, 1.4, 1.5]


@pytest.mark.timeout(600)
def test_ray_tampo_matches_local(ray_cluster, tmp_path):
    common = ["env=choose_item", "model=tiny", "algo=tampo", "trainer.total_steps=3", "trainer.tasks_per_step=2",
              "trainer.progress=false", "trainer.loggers=[jsonl]", "engine.max_new_tokens=8",
              "env_server.mode=local", "trainer.save_episodes=all"]
    main(common + [f"trainer.output_dir={tmp_path / 'local'}"])
    main(common + [f"trainer.output_dir={tmp_path / 'ray'}", "trainer.backend=ray", "trainer.num_learners=1",
                   "rollout.num_workers=1", "trainer.learner_cpus=0.5", "rollout.worker_cpus=0.5"])
    local, ray_ = (read_metrics(tmp_path / name / "metrics.jsonl", "train") for name in ("local", "ray"))
    assert [r["tampo/t"] for r in ray_] == [r["tampo/t"] for r in local]
    for a, b in zip(local, ray_):
        for t in TEMPS:
            assert b[f"tampo/adv/{t:g}"] == pytest.approx(a[f"tampo/adv/{t:g}"], abs=1e-6)
        lines = (tmp_path / "ray" / "episodes" / f"step_{b['step']:06d}.jsonl").read_text().splitlines()
        assert {round(json.loads(line)["temperature"], 6) for line in lines} == {round(b["tampo/t"], 6)}
    states = [json.loads((tmp_path / name / "checkpoints" / "step_3" / "extra.json").read_text())["tampo_state"]
              for name in ("local", "ray")]
    assert states[1]["rng"] == states[0]["rng"]
    assert states[1]["ema"] == pytest.approx(states[0]["ema"], abs=1e-6)
