"""Cross-cutting env behaviour as wrappers: the invalid-action penalty applies the same through make_env
in-process, through the env server and in training."""

from __future__ import annotations

import pytest

import envs  # noqa: F401
from envs.wrappers import InvalidActionPenalty, make_env


def test_penalty_on_invalid_steps_only():
    env = make_env("agent_rl/ChooseItem-v0", invalid_action_penalty=0.25)
    assert isinstance(env, InvalidActionPenalty)
    _, info = env.reset(seed=0)
    _, r_bad, _, _, info_bad = env.step("fly to the moon")  # not admissible
    assert info_bad["invalid_action"] is True and info_bad["invalid_action_penalty"] == 0.25
    plain = make_env("agent_rl/ChooseItem-v0")
    plain.reset(seed=0)
    _, r_plain, _, _, _ = plain.step("fly to the moon")
    assert r_bad == pytest.approx(float(r_plain) - 0.25)
    env.reset(seed=0)
    _, _, _, _, info_ok = env.step(info["admissible_actions"][0])
    assert info_ok["invalid_action"] is False and info_ok["invalid_action_penalty"] == 0.0


def test_penalty_falls_back_on_the_admissible_list():
    """An env that does not report ``invalid_action``: an action outside the last admissible list is penalised."""
    import gymnasium

    class NoFlag(gymnasium.Wrapper):
        def step(self, action):
            obs, r, te, tr, info = self.env.step(action)
            info = {k: v for k, v in info.items() if k != "invalid_action"}
            return obs, r, te, tr, info

    env = InvalidActionPenalty(NoFlag(make_env("agent_rl/ChooseItem-v0")), 1.0)
    env.reset(seed=0)
    _, r, _, _, info = env.step("not an action")
    assert info["invalid_action_penalty"] == 1.0
    with pytest.raises(ValueError, match=">= 0"):
        InvalidActionPenalty(make_env("agent_rl/ChooseItem-v0"), -0.1)


def test_training_applies_the_penalty_through_the_env(tmp_path):
    """rollout.invalid_penalty reaches the env as invalid_action_penalty (LocalEnvPool -> make_env): a tiny random
    model on ChooseItem plays mostly invalid actions, so the mean reward goes below 0 by the penalty."""
    import json

    from agent_rl.config import load_config
    from agent_rl.train import main

    small = ["env=choose_item", "model=tiny", "env_server.mode=local", "trainer.total_steps=1",
             "trainer.tasks_per_step=1", "rollout.max_turns=2", "engine.max_new_tokens=4", "trainer.progress=false",
             "trainer.tensorboard=false", "algo=grpo"]
    assert load_config([*small, "rollout.invalid_penalty=0.5"]).env_kwargs["invalid_action_penalty"] == 0.5
    main([*small, "rollout.invalid_penalty=0.5", f"trainer.output_dir={tmp_path / 'run'}"])
    (rec,) = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert rec["episode/invalid_action_frac"] > 0
    assert rec["reward/mean"] < 0  # random 4-token answers: nearly every step invalid, each costing 0.5
