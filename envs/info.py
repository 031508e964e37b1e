"""The ``info`` keys every env here may return, in one place (the gym API's ``reset``/``step`` info dicts).

An env returns the keys it knows; the trainer, the evaluation and the servers read them by these names and types.
``tests/envs/test_env_info.py`` checks every registered ``agent_rl/...`` id against :class:`EnvInfo`.
"""

from __future__ import annotations

import typing
from typing import Any, TypedDict

__all__ = ["EnvInfo", "RESET_KEYS", "STEP_KEYS", "info_problems"]


class EnvInfo(TypedDict, total=False):
    """Keys shared by the envs' ``info`` (an env may add its own, e.g. WebShop's ``page``, Math's ``reference``).

    Attributes:
        task_id: the task instance (game, goal, problem), stable across runs; groups are formed per task.
        task_type: its family for per-type metrics (ALFWorld's six types, a math dataset, a TextWorld family).
        won: the episode succeeded (read after the final step; reward > 0 when an env cannot say).
        admissible_actions: the actions the env accepts now (agent envs; absent for free-form answers).
        invalid_action: the last action was not admissible / not understood (a step key).
        expert_action: what the env's expert would play now (``expert=True``).
    """

    task_id: str
    task_type: str
    won: bool
    admissible_actions: list[str]
    invalid_action: bool
    expert_action: str


#: keys every built-in env returns from ``reset`` and from every ``step``.
RESET_KEYS = ("task_id", "task_type")
STEP_KEYS = ("task_id", "task_type", "won")

_TYPES = typing.get_type_hints(EnvInfo)


def info_problems(info: dict[str, Any], required: tuple[str, ...] = ()) -> list[str]:
    """What in ``info`` breaks :class:`EnvInfo`: a ``required`` key missing, or a documented key of another type
    (``list[str]``: a list of str). Returns a list of messages, empty when the info conforms."""
    problems = [f"missing {k!r}" for k in required if k not in info]
    for key, tp in _TYPES.items():
        if key not in info:
            continue
        value = info[key]
        origin = typing.get_origin(tp)
        if origin is list:
            ok = isinstance(value, list) and all(isinstance(v, str) for v in value)
        else:
            ok = isinstance(value, tp) and not (tp is not bool and isinstance(value, bool))
        if not ok:
            problems.append(f"{key!r} is {type(value).__name__}, documented {tp}")
    return problems
