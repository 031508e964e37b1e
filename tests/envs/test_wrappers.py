"""Cross-cutting env behaviour as wrappers: the invalid-action penalty applies the same through make_env
in-process, through the env server and in training; the episode-over guard is on every env the project makes."""

from __future__ import annotations

import string

import gymnasium
import pytest

import envs  # noqa: F401
from envs.wrappers import EpisodeOverError, EpisodeOverGuard, InvalidActionPenalty, make_env


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
    from agent_rl.config.compose import load_config
    from agent_rl.logging import read_metrics
    from agent_rl.train import main

    small = ["env=choose_item", "model=tiny", "env_server.mode=local", "trainer.total_steps=1",
             "trainer.tasks_per_step=1", "rollout.max_turns=2", "engine.max_new_tokens=4", "trainer.progress=false",
             "trainer.loggers=[jsonl]", "algo=grpo"]
    assert load_config([*small, "rollout.invalid_penalty=0.5"]).env_kwargs["invalid_action_penalty"] == 0.5
    main([*small, "rollout.invalid_penalty=0.5", f"trainer.output_dir={tmp_path / 'run'}"])
    (rec,) = read_metrics(tmp_path / "run" / "metrics.jsonl", "train")
    assert rec["episode/invalid_action_frac"] > 0
    assert rec["reward/mean"] < 0  # random 4-token answers: nearly every step invalid, each costing 0.5


# ---- the episode-over guard on a user's env (issue 20) -----------------------------------------------------------
class _Counter(gymnasium.Env):
    """A user's env, registered with plain ``gymnasium.register`` (no guard): never terminates on its own, except on
    ``"stop"`` (reward 1.0); every step pays 1.0 so a step after the end would be visible as reward.
    ``reset(options={"fail": True})`` raises ``ValueError``."""

    observation_space = gymnasium.spaces.Text(64, charset=string.printable)
    action_space = gymnasium.spaces.Text(64, charset=string.printable)

    def __init__(self) -> None:
        self.calls = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if (options or {}).get("fail"):
            raise ValueError("reset refused on purpose")
        return "ready", {}

    def step(self, action):
        self.calls += 1
        return f"got {action}", 1.0, action == "stop", False, {}


gymnasium.register(id="test_wrappers/Counter-v0", entry_point=_Counter, max_episode_steps=2)


def test_make_env_guards_a_users_env():
    """``make_env`` adds the guard to an id registered without it, outside TimeLimit: after ``terminated`` and after
    ``truncated`` (the user's step limit) the env is not called again until reset."""
    plain = gymnasium.make("test_wrappers/Counter-v0")
    plain.reset()
    plain.step("stop")
    assert plain.step("stop")[1] == 1.0  # what the guard prevents: plain gymnasium pays again
    env = make_env("test_wrappers/Counter-v0")
    assert isinstance(env, EpisodeOverGuard) and isinstance(env.env, gymnasium.wrappers.TimeLimit)
    env.reset()
    assert env.step("stop")[1:4] == (1.0, True, False) and env.episode_over
    with pytest.raises(EpisodeOverError, match=r"terminated at step 1"):
        env.step("stop")
    assert env.unwrapped.calls == 1
    env.reset()
    assert not env.episode_over
    assert env.step("go")[1:4] == (1.0, False, False)
    assert env.step("go")[1:4] == (1.0, False, True)  # max_episode_steps=2: TimeLimit truncates
    with pytest.raises(EpisodeOverError, match=r"truncated at step 2"):
        env.step("go")
    assert env.unwrapped.calls == 3
    penalised = make_env("test_wrappers/Counter-v0", invalid_action_penalty=0.5)  # both wrappers, guard inside
    assert isinstance(penalised, InvalidActionPenalty) and isinstance(penalised.env, EpisodeOverGuard)


def test_make_env_adds_no_second_guard_to_a_builtin():
    env = make_env("agent_rl/ChooseItem-v0")
    guards = 0
    while isinstance(env, gymnasium.Wrapper):
        guards += isinstance(env, EpisodeOverGuard)
        env = env.env
    assert guards == 1


def test_a_reset_that_raises_keeps_the_latch():
    """Only a reset that succeeded starts a new episode (the env's state after a failed reset is unknown)."""
    env = make_env("test_wrappers/Counter-v0")
    env.reset()
    env.step("stop")
    with pytest.raises(ValueError, match="on purpose"):
        env.reset(options={"fail": True})
    with pytest.raises(EpisodeOverError):
        env.step("stop")
    env.reset()
    assert env.step("stop")[1] == 1.0


def test_env_host_guards_every_env_it_makes():
    """The env side of the server and of LocalEnvPool (``EnvHost``) makes envs with ``make_env``: a user's env id
    latches there too (the session layer answers 409 before this point; this is the layer below it)."""
    from envs.hosting.child import EnvHost

    host = EnvHost(keep_envs=0)
    assert host.handle("open", "s", ("test_wrappers/Counter-v0", None, 0, None))[0] == "ok"
    status, (obs, reward, terminated, truncated, info), _ = host.handle("step", "s", "stop")
    assert (status, reward, terminated) == ("ok", 1.0, True)
    status, payload, _ = host.handle("step", "s", "stop")
    assert status == "error" and payload.startswith("EpisodeOverError: step() after the episode ended")
    assert host.sessions["s"].unwrapped.calls == 1
    host.handle("close", "s", None)
