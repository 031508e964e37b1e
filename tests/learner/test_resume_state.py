"""Issue 20, section 4 (unit): a restored optimizer trains under the resumed run's config (the AdamW moments and step
count from the checkpoint, every hyper-parameter and the LR schedule from the config), for the RL learner and the
behaviour cloner alike; a checkpoint without a state file it is asked to restore is refused, or loaded weights-only
when asked (tiny model, real AdamW steps)."""

from __future__ import annotations

import copy

import pytest
import torch

from agent_rl.learner import AlgoConfig, Learner, OptimConfig, load_checkpoint, save_checkpoint
from agent_rl.learner.checkpoint import IncompleteCheckpoint, missing_state
from agent_rl.sft import BehaviourCloner

OLD = OptimConfig(lr=1e-3, warmup=4, weight_decay=0.01, betas=(0.9, 0.999), eps=1e-8)
NEW = OptimConfig(lr=2e-3, warmup=6, weight_decay=0.1, betas=(0.8, 0.95), eps=1e-6, max_grad_norm=0.5)


def _make(owner: str, model, tok, optim: OptimConfig):
    if owner == "learner":
        return Learner(model, tok, AlgoConfig(name="grpo"), optim)
    return BehaviourCloner(model, optim, micro_batch_size=1)


def _adamw_steps(owner_obj, n: int) -> None:
    """``n`` real AdamW steps (gradient 1 everywhere) and the schedule's steps after them, as an update makes."""
    for _ in range(n):
        for p in owner_obj.params:
            p.grad = torch.ones_like(p)
        owner_obj.optimizer.step()
        owner_obj.scheduler.step()


@pytest.mark.parametrize("owner", ["learner", "cloner"])
def test_a_restored_optimizer_takes_the_configs_hyper_parameters_and_keeps_its_moments(tiny, owner):
    model, tok = tiny
    a = _make(owner, model, tok, OLD)
    _adamw_steps(a, 2)
    # warm-up lr(n) = lr * min(1, (n + 1) / warmup) after n optimiser steps: 1e-3 * 3/4
    assert a.scheduler.get_last_lr()[0] == pytest.approx(7.5e-4, rel=1e-12)
    saved = a.state_dict()

    b = _make(owner, copy.deepcopy(model), tok, NEW)
    b.load_state_dict(saved)
    assert b.scheduler.last_epoch == 2  # the optimiser steps taken: the schedule continues there
    assert b.scheduler.get_last_lr()[0] == pytest.approx(2e-3 * 3 / 6, rel=1e-12)  # the new peak and warm-up
    for group in b.optimizer.param_groups:
        assert group["lr"] == pytest.approx(2e-3 * 3 / 6, rel=1e-12) and group["initial_lr"] == 2e-3
        assert (group["weight_decay"], tuple(group["betas"]), group["eps"]) == (0.1, (0.8, 0.95), 1e-6)
    first = b.params[0]
    state_a, state_b = a.optimizer.state[a.params[0]], b.optimizer.state[first]
    assert float(state_b["step"]) == 2.0 and torch.equal(state_a["exp_avg"], state_b["exp_avg"])
    assert torch.equal(state_a["exp_avg_sq"], state_b["exp_avg_sq"])
    _adamw_steps(b, 1)
    assert b.scheduler.get_last_lr()[0] == pytest.approx(2e-3 * 4 / 6, rel=1e-12)

    # the same config: the exact state back (the round trip of tests/learner/test_checkpoint.py)
    c = _make(owner, copy.deepcopy(model), tok, OLD)
    c.load_state_dict(saved)
    assert c.scheduler.state_dict() == a.scheduler.state_dict()
    assert [g["lr"] for g in c.optimizer.param_groups] == [g["lr"] for g in a.optimizer.param_groups]


def test_the_learner_lr_is_the_next_optimiser_steps(tiny):
    model, tok = tiny
    learner = Learner(model, tok, AlgoConfig(name="grpo"), OptimConfig(lr=1e-3, warmup=4))
    assert learner.lr == pytest.approx(2.5e-4, rel=1e-12)  # before any step: 1e-3 * 1/4
    _adamw_steps(learner, 1)
    assert learner.lr == pytest.approx(5e-4, rel=1e-12)


def test_a_missing_state_file_is_refused_unless_weights_only(tiny, tmp_path):
    model, tok = tiny
    learner = Learner(model, tok, AlgoConfig(name="grpo"), OLD)
    _adamw_steps(learner, 1)
    folder = save_checkpoint(tmp_path / "checkpoints" / "step_1", model, tok, learner, {"step": 1})
    assert missing_state(folder) == []
    (folder / "learner.pt").unlink()
    assert missing_state(folder) == ["learner.pt"]
    fresh_model = copy.deepcopy(model)
    with torch.no_grad():
        for p in fresh_model.parameters():
            p.add_(1.0)
    fresh = Learner(fresh_model, tok, AlgoConfig(name="grpo"), OLD)
    with pytest.raises(IncompleteCheckpoint, match=r"has no learner\.pt \(the optimizer.*trainer\.resume_weights_only"
                                                   r"=true.*model\.path=") as err:
        load_checkpoint(folder, fresh_model, fresh)
    assert str(folder) in str(err.value)
    assert load_checkpoint(folder, fresh_model) == {"step": 1}  # no learner asked for: weights only, as before
    # weights_only: the weights and extra load, the learner keeps its fresh state
    fresh = Learner(fresh_model, tok, AlgoConfig(name="grpo"), OLD)
    assert load_checkpoint(folder, fresh_model, fresh, weights_only=True) == {"step": 1}
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), fresh_model.parameters()))
    assert fresh.optimizer.state_dict()["state"] == {} and fresh.scheduler.last_epoch == 0

    (folder / "rng.pt").unlink()
    with pytest.raises(IncompleteCheckpoint, match=r"has no rng\.pt \(the python / numpy / torch RNG states\)"):
        load_checkpoint(folder, fresh_model)
    assert load_checkpoint(folder, fresh_model, restore_rng=False) == {"step": 1}
    assert load_checkpoint(folder, fresh_model, fresh, weights_only=True) == {"step": 1}


def test_a_value_head_the_checkpoint_lacks_is_refused(tiny):
    model, tok = tiny
    grpo = Learner(model, tok, AlgoConfig(name="grpo"), OLD)
    ppo = Learner(copy.deepcopy(model), tok, AlgoConfig(name="ppo", adv_estimator="gae"), OLD)
    with pytest.raises(ValueError, match=r"has no value head but this learner \(algo=ppo\) has one"):
        ppo.load_state_dict(grpo.state_dict())
    with pytest.raises(ValueError, match=r"has a value head but this learner \(algo=grpo\) has none"):
        grpo.load_state_dict(ppo.state_dict())
