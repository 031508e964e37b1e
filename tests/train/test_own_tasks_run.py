"""Issue 39's acceptance commands as one tiny run: math on a parquet file's rows (env.tasks, env.task_fields),
trainer.loggers=[jsonl,wandb,mlflow] with WANDB_MODE=offline (wandb/ and mlruns/ in the run dir, reward/mean at every
step, read back through each client's files) and trainer.curriculum=pass_rate (curriculum/learnable_frac every step,
the curriculum's state in the checkpoint)."""

from __future__ import annotations

import json

import pytest

datasets = pytest.importorskip("datasets")
pytest.importorskip("wandb")
pytest.importorskip("mlflow")

from test_trackers import mlflow_run, wandb_history  # noqa: E402

from agent_rl.episodes import load_episodes  # noqa: E402
from agent_rl.logging import read_metrics  # noqa: E402
from agent_rl.train import main  # noqa: E402

pytestmark = pytest.mark.slow  # end to end: a real training run (fast tier: pytest -m 'not slow')

ROWS = [{"question": "What is 2+3?", "final": "5"}, {"question": "What is 7*6?", "final": "42"},
        {"question": "What is 10-4?", "final": "6"}]


def test_file_tasks_trackers_and_curriculum_in_one_run(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    datasets.Dataset.from_list(ROWS).to_parquet(str(tmp_path / "tasks.parquet"))
    out = tmp_path / "run"
    main(["env=math", f"env.tasks={tmp_path / 'tasks.parquet'}", "env.task_fields.problem=question",
          "env.task_fields.answer=final", "model=tiny", "algo=grpo", "env_server.mode=local", "trainer.total_steps=2",
          "trainer.tasks_per_step=2", f"trainer.output_dir={out}", "trainer.loggers=[jsonl,wandb,mlflow]",
          "trainer.curriculum=pass_rate", "trainer.eval_every=0", "trainer.progress=false", "algo.group_size=2",
          "engine.max_new_tokens=8", "trainer.save_episodes=all"])
    rows = read_metrics(out / "metrics.jsonl", "train")
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["curriculum/learnable_frac"] is not None for r in rows)
    assert all(abs(sum(r[f"curriculum/pool_frac/{p}"] for p in ("too_easy", "learnable", "too_hard", "unseen")) - 1)
               < 1e-9 for r in rows)
    # the episodes played the file's rows (the problems in their prompts; dataset "file")
    problems = {ep["turns"][0]["info"]["problem"] for step in (1, 2) for ep in load_episodes(out, step)}
    assert problems <= {r["question"] for r in ROWS} and problems
    # W&B offline run and MLflow file store in the run dir, reward/mean at every step
    history = wandb_history(out)
    assert [s for s in sorted(history) if "reward/mean" in history[s]] == [1, 2]
    assert [history[s]["reward/mean"] for s in (1, 2)] == [r["reward/mean"] for r in rows]
    state = json.loads((out / "trackers.json").read_text())
    client, run = mlflow_run(out, state["mlflow"])
    assert [m.step for m in client.get_metric_history(run.info.run_id, "reward/mean")] == [1, 2]
    assert {"config.yaml", "curves.png", "summary.md"} <= {a.path for a in client.list_artifacts(run.info.run_id)}
    assert run.data.tags["checkpoint/step_2"].endswith("checkpoints/step_2")
    # the curriculum's state travels in the checkpoint
    extra = json.loads((out / "checkpoints" / "step_2" / "extra.json").read_text())
    assert extra["sampler"]["curriculum"]["step"] == 2 and extra["sampler"]["curriculum"]["num_tasks"] == 3


def test_a_resumed_curriculum_run_draws_the_same_tasks(tmp_path):
    rows = [{"question": f"What is {i}+{i}?", "final": str(2 * i)} for i in range(8)]
    datasets.Dataset.from_list(rows).to_parquet(str(tmp_path / "tasks.parquet"))
    common = ["env=math", f"env.tasks={tmp_path / 'tasks.parquet'}", "env.task_fields.problem=question",
              "env.task_fields.answer=final", "model=tiny", "algo=grpo", "env_server.mode=local",
              "trainer.tasks_per_step=2", "trainer.curriculum=pass_rate", "trainer.eval_every=0",
              "trainer.progress=false", "algo.group_size=2", "engine.max_new_tokens=8", "trainer.save_episodes=all",
              "trainer.loggers=[jsonl]", "trainer.save_every=1", "trainer.keep_checkpoints=0"]

    def drawn(out, step):
        return sorted(ep["turns"][0]["info"]["problem"] for ep in load_episodes(out, step))

    main([*common, "trainer.total_steps=3", f"trainer.output_dir={tmp_path / 'whole'}"])
    main([*common, "trainer.total_steps=2", f"trainer.output_dir={tmp_path / 'split'}"])
    main([*common, "trainer.total_steps=3", f"trainer.output_dir={tmp_path / 'split'}", "trainer.resume=auto"])
    for step in (1, 2, 3):
        assert drawn(tmp_path / "split", step) == drawn(tmp_path / "whole", step), step
    whole = read_metrics(tmp_path / "whole" / "metrics.jsonl", "train")[-1]
    split = read_metrics(tmp_path / "split" / "metrics.jsonl", "train")[-1]
    assert {k: v for k, v in whole.items() if k.startswith("curriculum/pool_frac")} == \
        {k: v for k, v in split.items() if k.startswith("curriculum/pool_frac")}
