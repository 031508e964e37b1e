"""Progress display (plain lines when not a terminal), the end-of-run report, and the in-training eval panel."""

from __future__ import annotations

import io
import json

import pytest

from agent_rl.progress import Progress
from agent_rl.logging import read_metrics
from agent_rl.report import finish_run


def test_progress_plain_lines_without_terminal():
    buf = io.StringIO()
    p = Progress(stream=buf, interval_s=0.0)  # no heartbeat thread; a line at every event
    assert not p.tty
    p.phase("step 1/2 rollout", total=2)
    p.turn(10)
    p.episode()
    p.episode()
    p.phase("step 1/2 update")
    p.end()
    lines = buf.getvalue().splitlines()
    assert lines[0].endswith("step 1/2 rollout: 0/2 episodes")
    assert any("2/2 episodes, turns 1" in line for line in lines)
    assert lines[-1].endswith("step 1/2 update ...") and "\r" not in buf.getvalue()


def test_finish_run_curves_and_summary(tmp_path):
    # lines as written before rows had a kind: the step-0 evaluation alone, a later one merged into its step's line
    recs = [{"step": 0, "eval/alfworld_valid_unseen/success": 0.25},
            {"step": 1, "reward/mean": 0.1, "success/rate": 0.0, "rollout/episodes": 4.0, "actor/entropy": 1.0},
            {"step": 2, "reward/mean": 0.5, "success/rate": 0.5, "rollout/episodes": 4.0, "actor/entropy": 0.9,
             "eval/alfworld_valid_unseen/success": 0.5}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs) + "{cut")
    line = finish_run(tmp_path)
    assert "2 step(s), 8 episodes" in line and "25.0% -> 50.0%" in line
    text = (tmp_path / "summary.md").read_text()
    assert "| reward/mean | 0.5 |" in text and "success 25.0% (step 0) -> 50.0% (step 2)" in text
    assert (tmp_path / "curves.png").stat().st_size > 5000
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert [(r["kind"], r["step"]) for r in rows] == [("eval", 0), ("train", 1), ("train", 2), ("eval", 2)]


@pytest.mark.slow
def test_training_eval_panel_logged(tmp_path):
    from agent_rl.train import main

    out = tmp_path / "run"
    main(["env=math", "algo=grpo", "model=tiny", "algo.group_size=2", "trainer.total_steps=2",
          "trainer.tasks_per_step=1", "engine.max_new_tokens=8", "env_server.mode=local", "trainer.progress=false",
          "trainer.eval_every=2", "trainer.eval_panel=amc23", "trainer.eval_tasks=2", f"trainer.output_dir={out}"])
    recs = read_metrics(out / "metrics.jsonl")
    assert [(r["kind"], r["step"]) for r in recs] == [("eval", 0), ("train", 1), ("train", 2), ("eval", 2)]
    key = "eval/math_amc23/success"
    assert all(r[key] is not None and "reward/mean" not in r for r in recs if r["kind"] == "eval")
    assert all(r["reward/mean"] is not None and not any(k.startswith("eval/") for k in r)
               for r in recs if r["kind"] == "train")
    assert json.loads((out / "eval" / "step_2" / "math_amc23.json").read_text())["num_tasks"] == 2
    assert (out / "curves.png").is_file() and "eval math_amc23" in (out / "summary.md").read_text()
    with pytest.raises(ValueError, match="training split"):  # eval tasks must be held out
        main(["env=math", "model=tiny", "trainer.total_steps=1", "env_server.mode=local", "trainer.eval_every=1",
              "trainer.eval_panel=math_train_deepscaler", f"trainer.output_dir={tmp_path / 'bad'}"])


def test_cpu_preset_selected_without_gpu(monkeypatch):
    import torch

    from agent_rl.config.compose import load_config
    from agent_rl.train import with_device_preset

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    overrides, line = with_device_preset(["env=alfworld", "algo=tgrl"])  # ALFWorld's own CPU sizing (issue 35)
    assert overrides == ["env=alfworld", "algo=tgrl", "trainer=cpu_alfworld"]
    assert "\n" not in line and "trainer=cpu_alfworld" in line and "trainer=default" in line
    overrides, line = with_device_preset(["env=textworld", "algo=tgrl"])  # every other env: trainer=cpu
    assert overrides == ["env=textworld", "algo=tgrl", "trainer=cpu"]
    assert "\n" not in line and "trainer=cpu " in line and "trainer=default" in line
    assert with_device_preset(["trainer=default"]) == (["trainer=default"], "")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert with_device_preset(["env=alfworld"]) == (["env=alfworld"], "")
    # the preset wins over the env's budget (trainer comes after env in the defaults list); the CLI wins over both
    cfg = load_config(["env=alfworld", "algo=tgrl", "trainer=cpu"])
    assert (cfg.trainer.total_steps, cfg.trainer.tasks_per_step, cfg.rollout.max_turns, cfg.engine.max_new_tokens,
            cfg.trainer.eval_every, cfg.trainer.eval_tasks, cfg.eval.max_turns) == (4, 1, 3, 48, 4, 4, 8)
    assert load_config(["env=alfworld", "trainer=cpu", "rollout.max_turns=5"]).rollout.max_turns == 5
    assert load_config(["env=alfworld"]).rollout.max_turns == 50
