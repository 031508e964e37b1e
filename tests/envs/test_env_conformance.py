"""Every registered ``agent_rl/`` id: gymnasium's own conformance check (``env_checker.check_env``), and the same
action contract in-process as over HTTP (issue 10, section 6): a non-``str`` action is refused with ``TypeError``
before the env acts on it (the server answers 422), and the episode goes on as if it had not been sent."""

from __future__ import annotations

import warnings

import gymnasium
import pytest
from gymnasium.utils.env_checker import check_env

import envs
from envs.spaces import TextSpace

# Kwargs that keep each env cheap here (ALFWorld: a handful of games whose translations are cached).
KWARGS = {"agent_rl/ALFWorld-v0": {"split": "valid_unseen", "task_types": ["look_at_obj_in_light"]}}
# A valid first action of each env (any str is valid for all; these keep the episode going where it can).
ACTIONS = {"agent_rl/Calculator-v0": "calc[1 + 1]", "agent_rl/WebShop-v0": "search[pillow]",
           "agent_rl/ALFWorld-v0": "look", "agent_rl/Math-v0": "\\boxed{1}", "agent_rl/Code-v0": "def f(): pass",
           "agent_rl/ChooseItem-v0": "pick nothing", "agent_rl/TextWorld-v0": "look"}
IDS = sorted(envs._BUILTIN)


def make(env_id: str) -> gymnasium.Env:
    if env_id == "agent_rl/ALFWorld-v0":
        pytest.importorskip("alfworld")
        pytest.importorskip("textworld")
    return gymnasium.make(env_id, **KWARGS.get(env_id, {}))


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
