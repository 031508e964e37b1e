"""Every registered ``agent_rl/`` id: gymnasium's own conformance check (``env_checker.check_env``), the same
action contract in-process as over HTTP (issue 10, section 6): a non-``str`` action is refused with ``TypeError``
before the env acts on it (the server answers 422), and the episode goes on as if it had not been sent; and, through
``gymnasium.make``, a step after ``terminated`` or ``truncated`` raises ``EpisodeOverError`` until ``reset``
(issue 20: an ended episode must never pay again)."""

from __future__ import annotations

import warnings

import gymnasium
import pytest
from gymnasium.utils.env_checker import check_env

import envs
from envs.spaces import TextSpace
from envs.wrappers import EPISODE_OVER_GUARD, EpisodeOverError, EpisodeOverGuard

# Kwargs that keep each env cheap here (ALFWorld: a handful of games whose translations are cached).
KWARGS = {"agent_rl/ALFWorld-v0": {"split": "valid_unseen", "task_types": ["look_at_obj_in_light"]}}
# A valid first action of each env (any str is valid for all; these keep the episode going where it can).
ACTIONS = {"agent_rl/Calculator-v0": "calc[1 + 1]", "agent_rl/WebShop-v0": "search[pillow]",
           "agent_rl/ALFWorld-v0": "look", "agent_rl/Math-v0": "\\boxed{1}", "agent_rl/Code-v0": "def f(): pass",
           "agent_rl/ChooseItem-v0": "pick nothing", "agent_rl/TextWorld-v0": "look"}
IDS = sorted(envs._BUILTIN)


def make(env_id: str, **kwargs) -> gymnasium.Env:
    if env_id == "agent_rl/ALFWorld-v0":
        pytest.importorskip("alfworld")
        pytest.importorskip("textworld")
    return gymnasium.make(env_id, **KWARGS.get(env_id, {}), **kwargs)


def test_every_builtin_id_is_covered():
    assert set(IDS) == set(ACTIONS) and all(env_id in gymnasium.registry for env_id in IDS)


@pytest.mark.parametrize("env_id", IDS)
def test_gymnasium_check_env(env_id):
    env = make(env_id)
    env.unwrapped.action_space.seed(0)  # check_env samples actions: the same random text on every run
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)  # textworld leaves game files open (upstream)
            check_env(env.unwrapped, skip_render_check=True)
        assert isinstance(env.action_space, TextSpace) and isinstance(env.observation_space, TextSpace)
        assert env.action_space.contains(ACTIONS[env_id]) and env.action_space.contains("go to desk 1 ü")
    finally:
        env.close()


@pytest.mark.parametrize("env_id", IDS)
def test_non_str_action_is_refused_and_consumes_nothing(env_id):
    env = make(env_id)
    try:
        env.reset(seed=0)
        for bad in (1, None, b"look", ["look"], 2.5):
            assert not env.action_space.contains(bad)
            with pytest.raises(TypeError, match="takes a str action"):
                env.step(bad)
        # the episode is intact: single-step envs (math, code) can still take their one step
        obs, reward, terminated, truncated, info = env.step(ACTIONS[env_id])
        assert env.observation_space.contains(obs) and isinstance(reward, float)
    finally:
        env.close()


# ---- an ended episode never pays again (issue 20) ----------------------------------------------------------------
# The heavy envs reach `terminated` by their expert (info["expert_action"]); the others by one fixed action.
EXPERT_IDS = {"agent_rl/ALFWorld-v0", "agent_rl/WebShop-v0", "agent_rl/TextWorld-v0"}
FINISH = {"agent_rl/Calculator-v0": "answer[0]", "agent_rl/ChooseItem-v0": "pick mug",
          "agent_rl/Math-v0": "\\boxed{1}", "agent_rl/Code-v0": "def f(): pass"}


def test_every_registered_id_carries_the_guard():
    """Every ``agent_rl/`` id in gymnasium's registry is a built-in (covered below) and is registered with the
    guard, so plain ``gymnasium.make`` applies it, outermost, and ``gymnasium.make(env.spec)`` keeps exactly one."""
    registered = sorted(e for e in gymnasium.registry if e.startswith("agent_rl/"))
    assert registered == IDS and set(FINISH) | EXPERT_IDS == set(IDS)
    for env_id in IDS:
        assert gymnasium.registry[env_id].additional_wrappers == (EPISODE_OVER_GUARD,)
    env = gymnasium.make("agent_rl/Calculator-v0")
    assert isinstance(env, EpisodeOverGuard) and isinstance(env.env, gymnasium.wrappers.TimeLimit)
    again = gymnasium.make(env.spec)
    assert isinstance(again, EpisodeOverGuard) and not isinstance(again.env, EpisodeOverGuard)


def _finish(env: gymnasium.Env, env_id: str, info: dict) -> tuple:
    """Play until the episode ends -> the last step's ``(obs, reward, terminated, truncated, info)``."""
    while True:
        action = info["expert_action"] if env_id in EXPERT_IDS else FINISH[env_id]
        obs, reward, terminated, truncated, info = env.step(action)
        if terminated or truncated:
            return obs, reward, terminated, truncated, info


@pytest.mark.parametrize("env_id", IDS)
def test_step_after_terminated_raises_until_reset(env_id):
    kwargs = {"expert": True} if env_id in EXPERT_IDS else {}
    env = make(env_id, **kwargs)
    try:
        _, info = env.reset(seed=0)
        _, _, terminated, truncated, _ = _finish(env, env_id, info)
        assert terminated and not truncated
        for action in (ACTIONS[env_id], FINISH.get(env_id, "look")):  # any action, again and again
            with pytest.raises(EpisodeOverError, match=r"after the episode ended \(terminated at step \d+\).*reset"):
                env.step(action)
        assert isinstance(EpisodeOverError("x"), gymnasium.error.ResetNeeded)
        _, info = env.reset(seed=0)  # a reset clears the latch: the same episode plays again
        obs, reward, terminated, truncated, _ = _finish(env, env_id, info)
        assert terminated and not truncated and env.observation_space.contains(obs) and isinstance(reward, float)
    finally:
        env.close()


@pytest.mark.parametrize("env_id", IDS)
def test_step_after_truncated_raises_until_reset(env_id):
    """The step limit is gymnasium's TimeLimit, which the env never sees: the guard outside it latches it."""
    env = make(env_id, max_episode_steps=1)
    try:
        for _ in range(2):  # the second round after a reset: the latch was cleared
            env.reset(seed=0)
            _, _, _, truncated, _ = env.step(ACTIONS[env_id])
            assert truncated  # math and code also terminate on their one step
            with pytest.raises(EpisodeOverError, match="after the episode ended"):
                env.step(ACTIONS[env_id])
    finally:
        env.close()


def test_calculator_second_answer_raises():
    """Issue 20's input: the same correct answer twice paid 1.0 twice."""
    env = gymnasium.make("agent_rl/Calculator-v0")
    env.reset(seed=0, options={"problem": "1+1?", "answer": 2.0})
    obs, reward, terminated, truncated, info = env.step("answer[2]")
    assert (obs, reward, terminated, truncated, info["won"]) == ("Correct!", 1.0, True, False, True)
    with pytest.raises(EpisodeOverError, match=r"terminated at step 1"):
        env.step("answer[2]")
    env.reset(seed=0, options={"problem": "1+1?", "answer": 2.0})
    assert env.step("answer[3]")[1:3] == (0.0, True)
