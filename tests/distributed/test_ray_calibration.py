"""``algo.calibration=probe`` on ``trainer.backend=ray`` (algorithms.md 3b): the probe is played by the rollout
workers (``RayPlayer.play_specs``), and the chosen pair reaches every rollout worker and learner rank
(``RayBackend.set_temperatures``): the run reproduces the local backend's probe, choice, episode temperatures and
the learner's JS (taken at the chosen T0 / T1 on the ranks)."""

from __future__ import annotations

import json

import pytest

ray = pytest.importorskip("ray")

from agent_rl.logging import read_metrics  # noqa: E402
from agent_rl.train import main  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.mark.timeout(900)  # a hang ceiling, far above the runs on a busy machine
def test_ray_probe_matches_local(ray_cluster, tmp_path):
    common = ["env=choose_item", "model=tiny", "algo=tgrl", "algo.warmup_steps=0", "algo.calibration=probe",
              "algo.calibration.tasks=2", "algo.calibration.samples=4", "algo.calibration.t_low=[0.3]",
              "algo.calibration.t_high=[0.8,1.2]", "trainer.total_steps=2", "trainer.tasks_per_step=2",
              "trainer.progress=false", "trainer.loggers=[jsonl]", "rollout.max_turns=2", "engine.max_new_tokens=4",
              "env_server.mode=local", "trainer.save_episodes=all"]
    main(common + [f"trainer.output_dir={tmp_path / 'local'}"])
    main(common + [f"trainer.output_dir={tmp_path / 'ray'}", "trainer.backend=ray", "trainer.num_learners=1",
                   "rollout.num_workers=1", "trainer.learner_cpus=0.5", "rollout.worker_cpus=0.5"])
    cals = [next(json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()
                 if json.loads(line)["kind"] == "calibration") for name in ("local", "ray")]
    assert len(cals[0]["pairs"]) == len(cals[1]["pairs"]) == 2 and cals[0]["chosen"] == cals[1]["chosen"]
    for a, b in zip(*(c["pairs"] for c in cals)):
        assert a == pytest.approx(b)
    chosen = cals[1]["chosen"]
    local, ray_ = (read_metrics(tmp_path / name / "metrics.jsonl", "train") for name in ("local", "ray"))
    assert [r["tgrl/t_high"] for r in ray_] == [chosen["t_high"]] * 2
    for r in ray_:  # the workers sampled the chosen pair
        lines = (tmp_path / "ray" / "episodes" / f"step_{r['step']:06d}.jsonl").read_text().splitlines()
        assert {round(json.loads(line)["temperature"], 6) for line in lines} == {chosen["t_low"], chosen["t_high"]}
    # the ranks' JS at the chosen temperatures: the local run's numbers
    assert [r["credit/js_mean"] for r in ray_] == pytest.approx([r["credit/js_mean"] for r in local], abs=1e-5)
    assert [r["reward/mean"] for r in ray_] == pytest.approx([r["reward/mean"] for r in local])
