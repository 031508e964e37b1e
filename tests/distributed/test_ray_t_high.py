"""``algo.t_high=auto`` on ``trainer.backend=ray``: the driver picks T1 and sends it with the tasks, so the rollout
workers sample each step's T1 episodes at the pick, and the local backend's run is reproduced (same picks, same
delta_R, same bandit state)."""

from __future__ import annotations

import json

import pytest

ray = pytest.importorskip("ray")

from agent_rl.logging import read_metrics  # noqa: E402
from agent_rl.train import main  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.mark.timeout(600)
def test_ray_auto_t_high_matches_local(ray_cluster, tmp_path):
    common = ["env=choose_item", "model=tiny", "algo=tgrl", "algo.t_high=auto", "algo.warmup_steps=2",
              "trainer.total_steps=4", "trainer.tasks_per_step=2", "trainer.progress=false",
              "trainer.loggers=[jsonl]", "engine.max_new_tokens=8", "env_server.mode=local",
              "trainer.save_episodes=all"]
    main(common + [f"trainer.output_dir={tmp_path / 'local'}"])
    main(common + [f"trainer.output_dir={tmp_path / 'ray'}", "trainer.backend=ray", "trainer.num_learners=1",
                   "rollout.num_workers=1", "trainer.learner_cpus=0.5", "rollout.worker_cpus=0.5"])
    local, ray_ = (read_metrics(tmp_path / name / "metrics.jsonl", "train") for name in ("local", "ray"))
    assert [r["tgrl/t_high"] for r in ray_] == [r["tgrl/t_high"] for r in local] == [1.2, 1.0, 1.2, 1.4]
    assert [r["tgrl/delta_R"] for r in ray_] == pytest.approx([r["tgrl/delta_R"] for r in local], abs=1e-6)
    for r in ray_[1:]:  # the workers sampled the driver's pick
        lines = (tmp_path / "ray" / "episodes" / f"step_{r['step']:06d}.jsonl").read_text().splitlines()
        assert {round(json.loads(line)["temperature"], 6) for line in lines} == {0.3, r["tgrl/t_high"]}
    states = [json.loads((tmp_path / name / "checkpoints" / "step_4" / "extra.json").read_text())["tgrl_t_high"]
              for name in ("local", "ray")]
    assert states[0]["ladder"] == states[1]["ladder"]
    assert [s[:2] for s in states[0]["steps"]] == [s[:2] for s in states[1]["steps"]]
