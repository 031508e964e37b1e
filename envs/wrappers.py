"""Cross-cutting env behaviour as gymnasium wrappers, and :func:`make_env`, the one constructor that the env servers,
the in-process pool and the evaluation all call, so a wrapper applies the same everywhere.

Wrappers (each overrides one hook, like gymnasium's own ``RewardWrapper`` subclasses):

- :class:`EpisodeOverGuard`: a step after the episode ended (``terminated`` or ``truncated``) raises
  :class:`EpisodeOverError` until ``reset``, so an ended episode can never pay again. It sits outside gymnasium's
  ``TimeLimit`` (the env itself never sees a truncation) and is on every env the project makes: the built-in ids
  carry it in their registration (``additional_wrappers``, so plain ``gymnasium.make`` applies it), and
  :func:`make_env` adds it to any other id (a user's env registered with plain ``gymnasium.register``).
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
from gymnasium.envs.registration import WrapperSpec

__all__ = ["EPISODE_OVER_GUARD", "EpisodeOverError", "EpisodeOverGuard", "InvalidActionPenalty", "WRAPPER_KWARGS",
           "make_env"]


class EpisodeOverError(gymnasium.error.ResetNeeded, RuntimeError):
    """``step()`` after the episode ended (``terminated`` or ``truncated``): call ``reset()`` first.

    A :class:`gymnasium.error.ResetNeeded` (gymnasium's error for a step that needs a reset first) and a
    ``RuntimeError`` (what the envs' own guards raise). Over HTTP the session layer answers 409 ``episode_over``
    before the env is reached.
    """


class EpisodeOverGuard(gymnasium.Wrapper, gymnasium.utils.RecordConstructorArgs):
    """Latch the end of an episode: once a step returned ``terminated`` or ``truncated``, every further ``step``
    raises :class:`EpisodeOverError` (the env is not called) until ``reset`` succeeds.

    gymnasium's ``OrderEnforcing`` only refuses a step before the first reset; this guard refuses one after the
    episode ended. Apply it outside ``TimeLimit`` (as ``gymnasium.make`` does for ``additional_wrappers``), so a
    truncation latches too.
    """

    def __init__(self, env: gymnasium.Env) -> None:
        gymnasium.utils.RecordConstructorArgs.__init__(self)
        gymnasium.Wrapper.__init__(self, env)
        self._ended: str | None = None  # "terminated" / "truncated" once the episode ended, None while it runs
        self._steps = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        obs, info = self.env.reset(seed=seed, options=options)
        self._ended, self._steps = None, 0  # only a reset that succeeded starts a new episode
        return obs, info

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        if self._ended is not None:
            raise EpisodeOverError(f"step() after the episode ended ({self._ended} at step {self._steps}); "
                                   "call reset() to start a new episode")
        obs, reward, terminated, truncated, info = self.env.step(action)
        self._steps += 1
        if terminated or truncated:
            self._ended = "terminated" if terminated else "truncated"
        return obs, reward, terminated, truncated, info

    @property
    def episode_over(self) -> bool:
        """Whether the last step ended the episode (``step`` raises until ``reset``)."""
        return self._ended is not None


#: the registration entry of :class:`EpisodeOverGuard` (``gymnasium.register(..., additional_wrappers=(...,))``).
EPISODE_OVER_GUARD = WrapperSpec(name="EpisodeOverGuard", entry_point="envs.wrappers:EpisodeOverGuard", kwargs={})


def _wrapped_by(env: gymnasium.Env, cls: type[gymnasium.Wrapper]) -> bool:
    while isinstance(env, gymnasium.Wrapper):
        if isinstance(env, cls):
            return True
        env = env.env
    return False


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
    """``gymnasium.make(env_id, **kwargs)`` plus this package's wrappers: :class:`EpisodeOverGuard` (always; the
    built-in ids already carry it from their registration) and :class:`InvalidActionPenalty` when
    ``invalid_action_penalty > 0``. ``kwargs`` go to ``gymnasium.make`` (``max_episode_steps`` included).

    Raises:
        gymnasium.error.Error: unknown id (gymnasium's message). ValueError: a negative penalty.
    """
    env = gymnasium.make(env_id, **kwargs)
    if not _wrapped_by(env, EpisodeOverGuard):  # an id registered without it (a user's own env)
        env = EpisodeOverGuard(env)
    if invalid_action_penalty:
        env = InvalidActionPenalty(env, invalid_action_penalty)
    return env
