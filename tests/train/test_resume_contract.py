"""Issue 20, section 4, through ``agent_rl.train.main`` (local backend; the Ray one: tests/distributed/
test_ray_resume.py): a resume applies each key it lets change (``RESUME_APPLIED``) and logs ``actor/lr`` at the new
value, refuses every other change even with ``trainer.resume_allow_changes=true``, and refuses a checkpoint without
``learner.pt`` unless ``trainer.resume_weights_only=true``, which says what restarts (tiny model, ChooseItem,
in-process envs, 1-2 steps)."""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path

import pytest
import torch

from agent_rl.config.compose import config_dict

from agent_rl.config.schema import Config, ConfigError

from agent_rl.resume import RESUME_APPLIED, may_change_on_resume
from agent_rl.learner.config import OptimConfig
from agent_rl.train import main

pytestmark = pytest.mark.slow  # end to end: real training runs (fast tier: pytest -m 'not slow')

# algo=grpo, 1 task per step: one group, so each step makes exactly one optimiser step (asserted below); the entropy
# bonus gives every row a gradient whatever the rewards, so every step moves AdamW's state of every parameter
BASE = ["model=tiny", "env=choose_item", "env_server.mode=local", "algo=grpo", "algo.ent_coef=0.01",
        "trainer.tasks_per_step=1",
        "rollout.max_turns=1", "engine.max_new_tokens=4", "trainer.progress=false", "trainer.loggers=[jsonl]",
        "trainer.save_episodes=none", "optim.lr=1e-3", "optim.warmup=4"]


def lr_by_step(out: Path) -> dict[int, float]:
    """``actor/lr`` by step from ``out/metrics.jsonl``: every row that has a value for it (whatever else a row
    holds), the last row of a step winning (a resumed run may log a step again)."""
    found: dict[int, float] = {}
    for text in (out / "metrics.jsonl").read_text().splitlines():
        try:
            row = json.loads(text)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict) and row.get("actor/lr") is not None:
            found[int(row["step"])] = float(row["actor/lr"])
    return found


def optimizer_steps(out: Path) -> dict[int, float]:
    rows = [json.loads(t) for t in (out / "metrics.jsonl").read_text().splitlines() if t.strip()]
    return {int(r["step"]): r["actor/optimizer_steps"] for r in rows if r.get("actor/optimizer_steps") is not None}


def _learner_state(out: Path, step: int) -> dict:
    return torch.load(out / "checkpoints" / f"step_{step}" / "learner.pt", weights_only=False)


def _leaves(node: dict, prefix: str = "") -> set[str]:
    out: set[str] = set()
    for key, value in node.items():
        out |= _leaves(value, f"{prefix}{key}.") if isinstance(value, dict) and value else {f"{prefix}{key}"}
    return out


def test_every_resume_applied_key_is_a_config_key_with_its_code():
    leaves = _leaves(config_dict(Config()))
    for key in RESUME_APPLIED:
        assert key in leaves, key  # a key of the schema (not a group, not a typo)
        assert not may_change_on_resume(key), key  # one class per key
        assert RESUME_APPLIED[key].strip(), key
    # every optimiser hyper-parameter is one of them: the restored AdamW state would otherwise keep the old one
    assert {f"optim.{f.name}" for f in fields(OptimConfig)} <= set(RESUME_APPLIED)


def test_a_changed_lr_is_applied_from_the_first_resumed_step_and_logged(tmp_path, capsys):
    out = tmp_path / "D"
    main([*BASE, "trainer.total_steps=1", f"trainer.output_dir={out}"])
    resume = [*BASE, "trainer.total_steps=2", f"trainer.output_dir={out}", "trainer.resume=auto", "optim.lr=2e-3",
              "optim.weight_decay=0.05", "optim.betas=[0.8,0.99]", "optim.eps=1e-6", "optim.max_grad_norm=0.5"]
    with pytest.raises(ConfigError, match=r"resuming changes 5 key\(s\) that must match .*optim\.lr: 0\.001 -> "
                                          r"0\.002.*Add trainer\.resume_allow_changes=true to resume and apply"):
        main(resume)
    capsys.readouterr()
    main([*resume, "trainer.resume_allow_changes=true"])
    err = capsys.readouterr().err
    assert f"resume: optim.lr: 0.001 -> 0.002 (applied: {RESUME_APPLIED['optim.lr']})" in err
    assert "resume: WARNING: 5 key(s) changed (trainer.resume_allow_changes=true)" in err
    # lr(n) = peak * min(1, (n + 1) / warmup) after n optimiser steps, one per training step here
    assert optimizer_steps(out) == {1: 1.0, 2: 1.0}
    assert f"resumed from {out / 'checkpoints' / 'step_1'} at step 2 (actor/lr 0.001)" in err  # 2e-3 * 2/4
    # step 1 under 1e-3: 1e-3 * 2/4; step 2 under 2e-3: 2e-3 * 3/4 (the old code kept 1e-3: 7.5e-4)
    assert lr_by_step(out) == {1: pytest.approx(5e-4, rel=1e-9), 2: pytest.approx(1.5e-3, rel=1e-9)}
    state = _learner_state(out, 2)  # what the step-2 optimizer ran with, and its restored moments
    for group in state["optimizer"]["param_groups"]:
        assert group["initial_lr"] == 2e-3 and group["lr"] == pytest.approx(1.5e-3, rel=1e-9)
        assert (group["weight_decay"], tuple(group["betas"]), group["eps"]) == (0.05, (0.8, 0.99), 1e-6)
    assert {float(s["step"]) for s in state["optimizer"]["state"].values()} == {2.0}  # continued, not restarted
    extra = json.loads((out / "checkpoints" / "step_2" / "extra.json").read_text())
    assert extra["config"]["optim"]["lr"] == 2e-3 and extra["config"]["optim"]["max_grad_norm"] == 0.5


@pytest.mark.parametrize(("override", "key"), [("trainer.seed=1", "trainer.seed"),
                                               ("algo.group_size=2", "algo.group_size"),
                                               ("model.tiny_num_layers=3", "model.tiny_num_layers")])
def test_a_change_nothing_applies_is_refused_even_when_allowed(tmp_path, override, key):
    out = tmp_path / "D"
    main([*BASE, "trainer.total_steps=1", f"trainer.output_dir={out}"])
    with pytest.raises(ConfigError) as err:
        main([*BASE, "trainer.total_steps=2", f"trainer.output_dir={out}", "trainer.resume=auto",
              "trainer.resume_allow_changes=true", "optim.lr=2e-3", override])
    msg = str(err.value)
    assert f"even with trainer.resume_allow_changes=true: {key}: " in msg and "\n" not in msg
    assert "optim.lr: " not in msg.split("Only these keys")[0]  # the refusal names the key that cannot change
    assert lr_by_step(out).keys() == {1} and not list(out.glob("config.resume-*"))


def test_a_checkpoint_without_learner_state_is_refused_unless_weights_only(tmp_path, capsys):
    out = tmp_path / "D"
    main([*BASE, "trainer.total_steps=1", f"trainer.output_dir={out}"])
    ckpt = out / "checkpoints" / "step_1"
    (ckpt / "learner.pt").unlink()
    resume = [*BASE, "trainer.total_steps=2", f"trainer.output_dir={out}", "trainer.resume=auto"]
    with pytest.raises(ConfigError, match=rf"checkpoint {ckpt} has no learner\.pt \(the optimizer .*warm-up.*\): "
                                          r"resuming would restart that state silently\. Set "
                                          r"trainer\.resume_weights_only=true"):
        main(resume)
    assert lr_by_step(out).keys() == {1}
    capsys.readouterr()
    main([*resume, "trainer.resume_weights_only=true"])
    err = capsys.readouterr().err
    assert ("resume: trainer.resume_weights_only=true (learner.pt is missing): restarting the optimizer (AdamW "
            "moments and step count from 0); the LR warm-up (optim.warmup=4 optimiser steps up to optim.lr=0.001); "
            f"the mini-batch shuffling generator (trainer.seed); kept from {ckpt}: the policy weights, the step, the "
            "task sampler's position, the RNG states") in err
    # the warm-up restarted: step 2 is the first optimiser step again, 1e-3 * 2/4 (continuing would give 1e-3 * 3/4)
    assert lr_by_step(out) == {1: pytest.approx(5e-4, rel=1e-9), 2: pytest.approx(5e-4, rel=1e-9)}
    state = _learner_state(out, 2)
    assert {float(s["step"]) for s in state["optimizer"]["state"].values()} == {1.0}


def test_a_checkpoint_folder_without_extra_json_is_refused(tmp_path):
    out = tmp_path / "D"
    main([*BASE, "trainer.total_steps=1", f"trainer.output_dir={out}"])
    ckpt = out / "checkpoints" / "step_1"
    (ckpt / "extra.json").unlink()
    with pytest.raises(ConfigError, match=rf"checkpoint {ckpt} has no extra\.json \(the step and the task sampler's "
                                          rf"position\): it cannot be resumed; .*model\.path={ckpt}"):
        main([*BASE, "trainer.total_steps=2", f"trainer.output_dir={tmp_path / 'E'}", f"trainer.resume={ckpt}"])
