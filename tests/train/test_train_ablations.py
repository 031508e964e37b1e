"""The ablations of the TGRL and TP-Schedule papers are configs: each resolves to the intended sampling plan and
advantage pipeline, and runs one step (tiny model, ChooseItem, in-process envs). The table in docs/training.md maps
each paper row to these command lines."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent_rl import algos
from agent_rl.config.compose import load_config
from agent_rl.logging import read_metrics
from agent_rl.rollout.orchestrator import group_temperatures
from agent_rl.train import main

pytestmark = pytest.mark.slow  # end to end: real training runs (fast tier: pytest -m 'not slow')

SMALL = ["env=choose_item", "model=tiny", "env_server.mode=local", "trainer.total_steps=1", "trainer.tasks_per_step=2",
         "rollout.max_turns=2", "engine.max_new_tokens=6", "trainer.progress=false", "trainer.loggers=[jsonl]"]

# paper row -> (overrides, temperatures of a group after warm-up, JS stage strength, credit rule, low rows zeroed)
ABLATIONS = {
    "GRPO@T0": (["algo=grpo", "algo.temperature=0.3"], [(0.3, False)] * 4, None, "uniform", False),
    "GRPO@T1": (["algo=grpo", "algo.temperature=1.2"], [(1.2, False)] * 4, None, "uniform", False),
    "mixed groups, uniform credit": (["algo=tgrl", "credit=uniform", "algo.warmup_steps=0"],
                                     [(0.3, False)] + [(1.2, True)] * 3, None, "uniform", True),
    "TGRL": (["algo=tgrl", "algo.warmup_steps=0"], [(0.3, False)] + [(1.2, True)] * 3, 1.0, None, True),
    "TP static": (["algo=grpo", "credit=tp", "schedule.value=0.5"], [(1.0, False)] * 4, None, "tp", False),
    "TP scheduled": (["algo=grpo", "credit=tp", "schedule=linear"], [(1.0, False)] * 4, None, "tp", False),
    "Forking-Tok static": (["algo=grpo", "credit=forking", "schedule=constant"], [(1.0, False)] * 4, None,
                           "forking", False),
    "Forking-Tok scheduled": (["algo=grpo", "credit=forking", "schedule=linear"], [(1.0, False)] * 4, None,
                              "forking", False),
    "entropy advantage scheduled": (["algo=grpo", "credit=entropy_adv", "schedule=linear"], [(1.0, False)] * 4, None,
                                    "entropy_adv", False),
}


def test_tgrl_preset_is_the_reference_recipe():
    cfg = load_config(["algo=tgrl"])
    assert (cfg.algo.num_mini_batches, cfg.algo.ppo_epochs) == (4, 1)
    assert (cfg.optim.lr, cfg.optim.warmup, cfg.optim.weight_decay, cfg.optim.max_grad_norm) == (1e-6, 10, 0.1, 1.0)
    assert (cfg.algo.clip_low, cfg.algo.clip_high, cfg.algo.dual_clip) == (0.2, 0.2, 3.0)
    assert load_config(["algo=tgrl", "model=tiny"]).optim.lr == 1e-3  # model=tiny may still override lr
    assert load_config(["algo=tgrl", "algo.num_mini_batches=1"]).algo.num_mini_batches == 1
    assert load_config(["algo=grpo"]).algo.num_mini_batches == 1


@pytest.mark.parametrize("row", list(ABLATIONS))
def test_paper_ablation_runs_one_step(tmp_path: Path, row: str):
    overrides, temps, js_strength, credit, zero_low = ABLATIONS[row]
    cfg = load_config([*SMALL, *overrides])
    assert group_temperatures(cfg.algo, step=1) == temps
    S = 0.5 if cfg.schedule.value is not None else algos.schedule_value(cfg.schedule.kind, 1, 100)
    plan = algos.advantage_plan(is_tgrl=cfg.algo.is_tgrl, warmup=cfg.algo.is_tgrl and 1 <= cfg.algo.warmup_steps,
                                credit=cfg.credit.name, level=cfg.credit.level, S=S,
                                scheduled=cfg.schedule.kind != "none" or cfg.schedule.value is not None)
    assert (plan.js_strength, plan.credit, plan.zero_low_rows) == (js_strength, credit, zero_low)
    out = tmp_path / "run"
    main([*SMALL, *overrides, f"trainer.output_dir={out}"])
    (rec,) = read_metrics(out / "metrics.jsonl", "train")
    assert rec["actor/grad_norm"] is not None and rec["actor/grad_norm"] >= 0
    if js_strength:
        assert rec["credit/js_mean"] > 0  # the JS was computed on the high rows
    else:
        assert rec["credit/js_mean"] == 0.0
    if credit in ("tp", "forking") and row.endswith("static"):
        assert rec["credit/trained_token_frac"] < 1.0
    if row == "TGRL":
        assert rec["actor/optimizer_steps"] == 2.0  # 4 mini-batches capped at the 2 groups of the step


def test_turn_budget_has_one_knob():
    """rollout.max_turns is the turn budget: it reaches the env as gymnasium's max_episode_steps (TimeLimit), so the
    env truncates exactly at the rollout's last turn; single-turn envs keep their own registration."""
    import gymnasium

    import envs  # noqa: F401
    from agent_rl.config.schema import ConfigError

    cfg = load_config(["env=choose_item", "rollout.max_turns=2"])
    assert cfg.env_kwargs["max_episode_steps"] == 2
    env = gymnasium.make(cfg.env.id, **cfg.env_kwargs)
    env.reset(seed=0)
    wrong = "go to the moon"  # never the target: the episode runs until the budget
    _, _, term1, trunc1, _ = env.step(wrong)
    _, _, term2, trunc2, _ = env.step(wrong)
    assert (term1, trunc1, term2, trunc2) == (False, False, False, True)
    assert "max_episode_steps" not in load_config(["env=math"]).env_kwargs  # rollout.max_turns=1: terminated only
    with pytest.raises(ConfigError, match="rollout.max_turns"):
        load_config(["env=choose_item", "+env.kwargs.max_episode_steps=3"])
