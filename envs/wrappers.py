"""Cross-cutting env behaviour as gymnasium wrappers, and :func:`make_env`, the one constructor that the env servers,
the in-process pool and the evaluation all call, so a wrapper applies the same everywhere.

Wrappers (each overrides one hook, like gymnasium's own ``RewardWrapper`` subclasses):

- :class:`InvalidActionPenalty`: subtracts a fixed penalty from the reward of every step whose action the env did
  not accept (``info["invalid_action"]``, or, when the env does not say, an action outside the previous
  ``info["admissible_actions"]``). verl-agent uses 0.1 in some setups; the trainer's key is
  ``rollout.invalid_penalty``.

Step limits stay gymnasium's ``TimeLimit`` (``max_episode_steps=``, which :func:`make_env` passes to
``gymnasium.make``).
"""

from __future__ import annotations

from typing import Any, SupportsFloat

import gymnasium

__all__ = ["InvalidActionPenalty", "WRAPPER_KWARGS", "make_env"]


class InvalidActionPenalty(gymnasium.Wrapper):
    """``reward - penalty`` on a step whose action the env did not accept; ``info["invalid_action_penalty"]`` says
    what was subtracted (0.0 on valid steps).

    Args:
        env: the env to wrap. penalty: >= 0, in reward units.
    Raises:
        ValueError: a negative penalty.
    """

    def __init__(self, env: gymnasium.Env, penalty: float) -> None:
        if penalty < 0:
            raise ValueError(f"invalid_action_penalty must be >= 0, got {penalty}")
        super().__init__(env)
        self.penalty = float(penalty)
        self._admissible: list[str] | None = None

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        obs, info = self.env.reset(seed=seed, options=options)
        self._admissible = info.get("admissible_actions")
        return obs, info

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        invalid = info.get("invalid_action")
        if invalid is None:  # the env does not say: judge by the admissible list it gave before this step
            invalid = self._admissible is not None and action not in self._admissible
        self._admissible = info.get("admissible_actions")
        cut = self.penalty if invalid else 0.0
        info = {**info, "invalid_action_penalty": cut}
        return obs, float(reward) - cut, terminated, truncated, info


#: keyword arguments :func:`make_env` takes for its wrappers (not passed to the env's constructor).
WRAPPER_KWARGS = ("invalid_action_penalty",)


def make_env(env_id: str, *, invalid_action_penalty: float = 0.0, **kwargs: Any) -> gymnasium.Env:
    """``gymnasium.make(env_id, **kwargs)`` plus this package's wrappers (:class:`InvalidActionPenalty` when
    ``invalid_action_penalty > 0``). ``kwargs`` go to ``gymnasium.make`` (``max_episode_steps`` included).

    Raises:
        gymnasium.error.Error: unknown id (gymnasium's message). ValueError: a negative penalty.
    """
    env = gymnasium.make(env_id, **kwargs)
    if invalid_action_penalty:
        env = InvalidActionPenalty(env, invalid_action_penalty)
    return env
