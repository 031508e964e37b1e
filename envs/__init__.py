"""Text environments with the gymnasium API. ``import envs`` registers the built-in ids.

Every env here is a ``gymnasium.Env[str, str]``: ``reset(*, seed=None, options=None) -> (observation, info)`` and
``step(action) -> (observation, reward, terminated, truncated, info)``; its spaces are :class:`envs.spaces.TextSpace`
and ``step`` refuses a non-``str`` action with ``TypeError`` (422 over HTTP). Every id passes gymnasium's
``env_checker.check_env`` (``tests/envs/test_env_conformance.py``), and through ``gymnasium.make`` a step after the
episode ended (``terminated`` or ``truncated``) raises :class:`envs.wrappers.EpisodeOverError` until ``reset``. An
env that could not judge raises :class:`envs.errors.EnvInfraError`, never a reward (``docs/env_errors.md``). Ids are
versioned and entry points are strings, so importing this package loads no environment code (ALFWorld, WebShop, ...
import lazily in ``make``).
This package imports nothing from ``agent_rl``.
"""

from __future__ import annotations

import gymnasium

# id -> (entry point, max_episode_steps). The step limit is gymnasium's TimeLimit wrapper (truncated=True),
# not a flag inside the env; pass ``max_episode_steps=`` to ``gymnasium.make`` to change it. Each id is registered
# with ``envs.wrappers.EpisodeOverGuard`` as an additional wrapper (applied by ``gymnasium.make`` outside TimeLimit):
# a step after ``terminated`` or ``truncated`` raises ``EpisodeOverError`` until ``reset``.
_BUILTIN: dict[str, tuple[str, int | None]] = {
    "agent_rl/ALFWorld-v0": ("envs.alfworld:ALFWorldEnv", 50),
    "agent_rl/WebShop-v0": ("envs.webshop:WebShopEnv", 15),
    "agent_rl/TextWorld-v0": ("envs.textworld:TextWorldEnv", 100),
    "agent_rl/Math-v0": ("envs.math:MathEnv", None),
    "agent_rl/Code-v0": ("envs.code:CodeEnv", None),
    "agent_rl/Calculator-v0": ("envs.examples.calculator:CalculatorEnv", 10),
    "agent_rl/ChooseItem-v0": ("envs.examples.choose_item:ChooseItemEnv", 4),
}


# Same seed and action, different step info: Code-v0 reports sandbox wall-clock times (and a test can time out under
# load), so gymnasium's step-determinism check (``env_checker.check_env``) must not expect equal infos.
_NONDETERMINISTIC = {"agent_rl/Code-v0"}


def register_builtin() -> None:
    """Register the built-in ids with gymnasium (idempotent)."""
    from envs.wrappers import EPISODE_OVER_GUARD  # gymnasium only: still no environment code

    for env_id, (entry_point, max_steps) in _BUILTIN.items():
        if env_id not in gymnasium.registry:
            gymnasium.register(
                id=env_id, entry_point=entry_point, max_episode_steps=max_steps, disable_env_checker=True,
                nondeterministic=env_id in _NONDETERMINISTIC, additional_wrappers=(EPISODE_OVER_GUARD,),
            )


register_builtin()

__all__ = ["register_builtin"]
