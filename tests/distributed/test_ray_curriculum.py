"""trainer.curriculum=pass_rate and the trackers on ``trainer.backend=ray`` (issue 39): the driver's sampler draws the
same file tasks as the local backend's run, its curriculum state is the same, and the trackers log from the driver
only (one MLflow run, reward/mean once per step; one W&B offline run) while two rollout workers play."""

from __future__ import annotations

import json

import pytest

ray = pytest.importorskip("ray")
datasets = pytest.importorskip("datasets")
pytest.importorskip("mlflow")
pytest.importorskip("wandb")

from agent_rl.episodes import load_episodes  # noqa: E402
from agent_rl.logging import read_metrics  # noqa: E402
from agent_rl.train import main  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.mark.timeout(900)
def test_ray_curriculum_matches_local_and_trackers_log_once(ray_cluster, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    rows = [{"question": f"What is {i}+{i}?", "final": str(2 * i)} for i in range(6)]
    datasets.Dataset.from_list(rows).to_parquet(str(tmp_path / "tasks.parquet"))
    common = ["env=math", f"env.tasks={tmp_path / 'tasks.parquet'}", "env.task_fields.problem=question",
              "env.task_fields.answer=final", "model=tiny", "algo=grpo", "algo.group_size=2",
              "trainer.total_steps=2", "trainer.tasks_per_step=2", "trainer.progress=false", "trainer.eval_every=0",
              "trainer.curriculum=pass_rate", "engine.max_new_tokens=8", "env_server.mode=local",
              "trainer.save_episodes=all"]
    main(common + [f"trainer.output_dir={tmp_path / 'local'}", "trainer.loggers=[jsonl]"])
    main(common + [f"trainer.output_dir={tmp_path / 'ray'}", "trainer.backend=ray", "trainer.num_learners=1",
                   "rollout.num_workers=2", "trainer.learner_cpus=0.25", "rollout.worker_cpus=0.25",
                   "trainer.loggers=[jsonl,wandb,mlflow]"])
    for step in (1, 2):
        drawn = [sorted(e["turns"][0]["info"]["problem"] for e in load_episodes(tmp_path / name, step))
                 for name in ("local", "ray")]
        assert drawn[0] == drawn[1]
    states = [json.loads((tmp_path / name / "checkpoints" / "step_2" / "extra.json").read_text())["sampler"]
              for name in ("local", "ray")]
    assert states[0] == states[1]
    records = read_metrics(tmp_path / "ray" / "metrics.jsonl", "train")
    assert all(r["curriculum/learnable_frac"] is not None for r in records)
    out = tmp_path / "ray"
    assert len(list(out.glob("wandb/offline-run-*"))) == 1
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=(out / "mlruns").resolve().as_uri())
    experiment = client.get_experiment_by_name("agent_rl")
    runs = client.search_runs([experiment.experiment_id])
    assert len(runs) == 1
    assert [m.step for m in client.get_metric_history(runs[0].info.run_id, "reward/mean")] == [1, 2]
