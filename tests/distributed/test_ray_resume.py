"""Issue 20, section 4, on ``trainer.backend=ray`` (the local backend: tests/train/test_resume_contract.py): a Ray
checkpoint records the run's config as a local one does (a resume compares with it, never the legacy path), a
changed ``optim.lr`` is applied by the learner rank and logged as ``actor/lr``, and a checkpoint without
``learner.pt`` is refused unless ``trainer.resume_weights_only=true``, which the rank honours (tiny model,
ChooseItem, in-process envs, one learner rank and one rollout worker, 1 step per run)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import ray  # noqa: F401  (the module needs Ray; its cluster fixture is in conftest.py)

from agent_rl.config.schema import ConfigError

from agent_rl.resume import RESUME_APPLIED
from agent_rl.train import main

pytestmark = pytest.mark.slow  # Ray actors on a local cluster (fast tier: pytest -m 'not slow')

COMMON = ["model=tiny", "env=choose_item", "env_server.mode=local", "algo=grpo", "algo.ent_coef=0.01",
          "trainer.tasks_per_step=1", "rollout.max_turns=1", "engine.max_new_tokens=4", "trainer.progress=false",
          "trainer.loggers=[jsonl]", "trainer.save_episodes=none", "optim.warmup=4", "trainer.backend=ray",
          "trainer.num_learners=1", "rollout.num_workers=1", "trainer.learner_cpus=0.5", "rollout.worker_cpus=0.5"]


def lr_by_step(out: Path) -> dict[int, float]:
    """``actor/lr`` by step from ``out/metrics.jsonl``: every row that has a value for it, the last one of a step
    winning."""
    found: dict[int, float] = {}
    for text in (out / "metrics.jsonl").read_text().splitlines():
        try:
            row = json.loads(text)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict) and row.get("actor/lr") is not None:
            found[int(row["step"])] = float(row["actor/lr"])
    return found


@pytest.mark.timeout(900)
def test_ray_checkpoints_record_the_config_apply_a_new_lr_and_refuse_missing_learner_state(ray_cluster, tmp_path,
                                                                                           capsys):
    out = tmp_path / "run"
    run = [*COMMON, f"trainer.output_dir={out}"]
    main([*run, "optim.lr=1e-3", "trainer.total_steps=1"])
    extra = json.loads((out / "checkpoints" / "step_1" / "extra.json").read_text())
    assert extra["step"] == 1 and extra["sampler"] == {"position": 1}
    saved = extra["config"]  # the run's resolved config, as a local checkpoint holds it
    assert saved["trainer"]["backend"] == "ray" and saved["optim"]["lr"] == 1e-3 and saved["algo"]["name"] == "grpo"
    assert saved["trainer"]["output_dir"] == str(out.resolve())

    # resume with a new peak lr: compared with extra.json (not the run's config.yaml), applied by the rank
    capsys.readouterr()
    main([*run, "optim.lr=2e-3", "trainer.total_steps=2", "trainer.resume=auto", "trainer.resume_allow_changes=true"])
    err = capsys.readouterr().err
    assert "no saved config found" not in err
    assert f"resume: optim.lr: 0.001 -> 0.002 (applied: {RESUME_APPLIED['optim.lr']})" in err
    assert "at step 2 (actor/lr 0.001)" in err  # 2e-3 * min(1, 2/4) before step 2's optimiser step
    # lr(n) = peak * min(1, (n + 1) / 4) after n optimiser steps (one per step): 1e-3 * 2/4, then 2e-3 * 3/4
    assert lr_by_step(out) == {1: pytest.approx(5e-4, rel=1e-9), 2: pytest.approx(1.5e-3, rel=1e-9)}

    # no learner.pt: refused before any actor starts; weights-only on request, the warm-up restarted on the rank
    (out / "checkpoints" / "step_2" / "learner.pt").unlink()
    resume = [*run, "optim.lr=2e-3", "trainer.total_steps=3", "trainer.resume=auto"]
    with pytest.raises(ConfigError, match=r"step_2 has no learner\.pt .*trainer\.resume_weights_only=true"):
        main(resume)
    capsys.readouterr()
    main([*resume, "trainer.resume_weights_only=true"])
    err = capsys.readouterr().err
    assert "resume: trainer.resume_weights_only=true (learner.pt is missing): restarting the optimizer" in err
    assert "at step 3 (actor/lr 0.0005)" in err  # a fresh schedule: 2e-3 * 1/4
    # step 3 is the first optimiser step of the new schedule: 2e-3 * 2/4 (continuing would give 2e-3 * 4/4)
    assert lr_by_step(out)[3] == pytest.approx(1e-3, rel=1e-9)


@pytest.mark.timeout(900)
def test_a_resumed_ray_run_equals_an_uninterrupted_one(ray_cluster, tmp_path):
    """``trainer.backend=ray`` (one learner rank, one rollout worker): 2 TGRL steps in one run, and 1 step then a
    resume for step 2, log the same metrics and end with the same step-2 parameters, exactly (no tolerance,
    ``scripts/compare_runs.py``): the checkpoint restores the rank's weights, AdamW state, schedule, RNG and the task
    sampler's position, and the worker gets weight version 1."""
    import subprocess
    import sys

    from agent_rl.logging import read_metrics

    run = ["model=tiny", "env=choose_item", "env_server.mode=local", "algo=tgrl", "algo.warmup_steps=1",
           "trainer.tasks_per_step=2", "engine.max_new_tokens=8", "trainer.progress=false", "trainer.loggers=[jsonl]",
           "trainer.save_episodes=none", "trainer.backend=ray", "trainer.num_learners=1", "rollout.num_workers=1",
           "trainer.learner_cpus=0.5", "rollout.worker_cpus=0.5"]
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    main([*run, "trainer.total_steps=2", f"trainer.output_dir={whole}"])
    main([*run, "trainer.total_steps=1", f"trainer.output_dir={parts}"])
    main([*run, "trainer.total_steps=2", f"trainer.output_dir={parts}", "trainer.resume=auto"])
    rows = read_metrics(parts / "metrics.jsonl", "train")
    assert [r["step"] for r in rows] == [1, 2] and rows[1]["rollout/weight_version"] == 1.0
    assert all(r["batch/rows"] > 0 for r in rows)
    script = Path(__file__).resolve().parents[2] / "scripts" / "compare_runs.py"
    cmp = subprocess.run([sys.executable, str(script), str(whole), str(parts), "--checkpoint", "step_2", "--atol", "0",
                          "--rtol", "0"], capture_output=True, text=True, timeout=120)
    assert cmp.returncode == 0, cmp.stdout + cmp.stderr
    assert "checkpoint step_2: 21 tensors compared, max |diff| 0" in cmp.stdout
