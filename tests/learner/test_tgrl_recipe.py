"""TGRL's recipe corrections (algorithms.md section 3): the warm-up covers the steps s < ``algo.warmup_steps``, and
the lr warm-up counts RL steps from 0 (``optim.warmup_unit=rl_step``, the ``algo=tgrl`` preset)."""

from __future__ import annotations

import copy

import pytest

from agent_rl.config.compose import load_config
from agent_rl.learner import AlgoConfig, CreditConfig, Learner, OptimConfig
from agent_rl.rollout import group_temperatures
from learner_helpers import sample_batch


def test_warmup_covers_steps_below_warmup_steps() -> None:
    algo = AlgoConfig(name="tgrl", warmup_steps=20)
    assert [s for s in range(1, 30) if algo.in_warmup(s)] == list(range(1, 20))
    assert group_temperatures(algo, 19) == [(1.2, True)] * 4  # the last warm-up step: every episode at T1
    assert group_temperatures(algo, 20) == [(0.3, False)] + [(1.2, True)] * 3
    assert not any(AlgoConfig(name="tgrl", warmup_steps=w).in_warmup(1) for w in (0, 1))
    assert not AlgoConfig(name="grpo", warmup_steps=20).in_warmup(1)  # only TGRL has one


def test_the_preset_counts_the_lr_warmup_in_rl_steps() -> None:
    cfg = load_config(["algo=tgrl", "env=choose_item", "model=tiny"])
    assert (cfg.optim.warmup, cfg.optim.warmup_unit) == (10, "rl_step")
    assert load_config(["algo=grpo", "env=choose_item", "model=tiny"]).optim.warmup_unit == "optimizer_step"


@pytest.mark.parametrize("bad", ["epoch", ""])
def test_unknown_warmup_unit_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="optim.warmup_unit"):
        OptimConfig(warmup_unit=bad)


def test_lr_of_rl_steps_1_2_and_11_with_four_optimiser_steps_each(tiny) -> None:
    """lr at RL step s = lr * min(1, (s - 1)/10): step 1 at 0, step 2 at lr/10, step 11 at lr; every optimiser step
    of an RL step (4 mini-batches) at that RL step's lr."""
    model, tok = tiny
    batch, _ = sample_batch(model, tok, groups=4, max_new_tokens=4)
    learner = Learner(copy.deepcopy(model), tok, AlgoConfig(name="tgrl", warmup_steps=0, num_mini_batches=4),
                      OptimConfig(lr=1e-3, warmup=10, warmup_unit="rl_step", weight_decay=0.0),
                      credit=CreditConfig(name="js"))
    seen: list[float] = []
    step_lrs = []
    learner.optimizer.register_step_pre_hook(lambda opt, args, kwargs: seen.append(opt.param_groups[0]["lr"]))
    for step in (1, 2, 11):
        seen.clear()
        metrics = learner.update(batch, step=step, total_steps=20)
        assert metrics["actor/optimizer_steps"] == 4.0
        assert len(set(seen)) == 1  # one lr for the whole RL step
        step_lrs.append(seen[0])
        assert metrics["actor/lr"] == pytest.approx(seen[0])
    assert step_lrs == pytest.approx([0.0, 1e-4, 1e-3])


def test_lr_counted_in_optimiser_steps_is_unchanged(tiny) -> None:
    """The default unit: lr after n optimiser steps = lr * min(1, (n + 1)/warmup), stepped per optimiser step."""
    model, tok = tiny
    batch, _ = sample_batch(model, tok, groups=2, max_new_tokens=4)
    learner = Learner(copy.deepcopy(model), tok, AlgoConfig(name="grpo", num_mini_batches=2),
                      OptimConfig(lr=1e-3, warmup=10, weight_decay=0.0))
    assert learner.lr == pytest.approx(1e-4)
    learner.update(batch, step=1, total_steps=5)
    assert learner.lr == pytest.approx(3e-4)  # two optimiser steps taken
