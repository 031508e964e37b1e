"""ALFWorld text games as a gymnasium env (id ``agent_rl/ALFWorld-v0``, registered by ``import envs``).

``ALFWorldEnv`` and the game-file helpers are imported lazily: importing this package does not import alfworld or
textworld until ``ALFWorldEnv`` is touched (``import alfworld`` needs ``$ALFWORLD_DATA`` set first, which
:func:`envs.alfworld.patches.install` does, before importing :mod:`envs.alfworld.speedups` and
:mod:`envs.alfworld.expert`).
"""

from __future__ import annotations

from typing import Any

from envs.alfworld.data import SPLITS, TASK_TYPES, games_home, list_games, task_id_of, task_type_of

__all__ = ["ALFWorldEnv", "SPLITS", "TASK_TYPES", "games_home", "list_games", "task_id_of", "task_type_of"]


def __getattr__(name: str) -> Any:
    if name == "ALFWorldEnv":
        from envs.alfworld.env import ALFWorldEnv

        return ALFWorldEnv
    raise AttributeError(f"module 'envs.alfworld' has no attribute {name!r}")
