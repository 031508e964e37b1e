"""A scripted env whose expert labels any state, for the DAgger tests (``env_server.imports=[tests.train.dagger_env]``).

``tests/Corridor-v0``: the agent stands at x on a line and must ``stop`` at 0. The start is ``options["index"]``
(or the reset seed) mod 7, minus 3: -3..3. Actions: ``left`` (x - 1), ``right`` (x + 1), ``stop`` (ends the
episode, won at x = 0), ``look`` (nothing); anything else is invalid and changes nothing. The expert
(``expert=True``: ``info["expert_action"]``) answers from the state alone (:func:`expert_for`): ``right`` below 0,
``left`` above, ``stop`` at 0, and gives up (``look``, as ALFWorld's expert) at |x| >= 3, the walls.
"""

from __future__ import annotations

from typing import Any

import gymnasium

from envs.families import EnvFamily, family_of, register_family
from envs.spaces import TextSpace, check_action

ENV_ID = "tests/Corridor-v0"
ACTIONS = ("left", "right", "stop", "look")


def expert_for(x: int) -> str:
    """The expert's action at position ``x`` (``look``: it gives up at the walls)."""
    if abs(x) >= 3:
        return "look"
    return "right" if x < 0 else "left" if x > 0 else "stop"


def start_of(index: int) -> int:
    return index % 7 - 3


class CorridorEnv(gymnasium.Env[str, str]):
    """See the module docstring. Info: ``admissible_actions``, ``won``, ``task_type`` (``corridor``), ``position``,
    ``expert_action`` (``expert=True``), ``invalid_action`` (on step)."""

    metadata = {"render_modes": []}

    def __init__(self, expert: bool = False) -> None:
        self.expert = expert
        self.observation_space = TextSpace(256)
        self.action_space = TextSpace(256)
        self.x = 0
        self._done = True

    def _info(self, won: bool = False) -> dict[str, Any]:
        info: dict[str, Any] = {"admissible_actions": list(ACTIONS), "won": won, "task_type": "corridor",
                                "position": self.x}
        if self.expert:
            info["expert_action"] = expert_for(self.x)
        return info

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        index = int((options or {}).get("index", seed or 0))
        self.x, self._done = start_of(index), False
        return f"You are at {self.x}. Your task is to: stop at 0.", self._info()

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        action = check_action(self, action).strip().lower()
        if self._done:
            raise RuntimeError("step() called after the episode ended; call reset()")
        invalid = action not in ACTIONS
        if action == "left":
            self.x -= 1
        elif action == "right":
            self.x += 1
        elif action == "stop":
            self._done = True
            won = self.x == 0
            return ("You stop. You win." if won else "You stop. You lose."), float(won), True, False, \
                {**self._info(won), "invalid_action": False}
        return f"You are at {self.x}.", 0.0, False, False, {**self._info(), "invalid_action": invalid}


if ENV_ID not in gymnasium.registry:
    gymnasium.register(ENV_ID, entry_point=CorridorEnv, max_episode_steps=6)
if family_of(ENV_ID) is None:
    register_family(EnvFamily(name="corridor", env_id=ENV_ID, expert_kwarg="expert", state_expert=True,
                              expert_gave_up="look", admissible_actions=True))
