"""Every registered ``agent_rl/...`` env returns the documented ``info`` keys (``envs.info.EnvInfo``) with their
types, from ``reset`` and from ``step``."""

from __future__ import annotations

import gymnasium
import pytest

import envs  # noqa: F401  (registers the built-in ids)
from envs.info import RESET_KEYS, STEP_KEYS, info_problems

IDS = sorted(k for k in gymnasium.registry if k.startswith("agent_rl/"))
SLOW = {"agent_rl/ALFWorld-v0"}  # a game load costs ~1.5 CPU-s: still run, once


def test_info_checker_catches_wrong_types():
    assert info_problems({"won": 1, "admissible_actions": ["a", 2]}, ("task_id",)) == [
        "missing 'task_id'", "'won' is int, documented <class 'bool'>", "'admissible_actions' is list, documented list[str]"]
    assert info_problems({"task_id": "x", "task_type": "t", "won": True}, STEP_KEYS) == []


@pytest.mark.parametrize("env_id", IDS)
def test_env_info_keys_and_types(env_id, request):
    if env_id in SLOW:
        request.getfixturevalue("require_alfworld")
    env = gymnasium.make(env_id)
    try:
        _, info = env.reset(seed=0)
        assert info_problems(info, RESET_KEYS) == [], info
        action = (info.get("admissible_actions") or ["look"])[0]
        _, _, _, _, step_info = env.step(action)
        assert info_problems(step_info, STEP_KEYS) == [], step_info
    finally:
        env.close()
