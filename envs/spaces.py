"""The action/observation space of every text env here, and the action check every ``step`` starts with.

gymnasium's ``spaces.Text`` only ``contains`` strings whose characters all lie in its charset (alphanumerics by
default), so ``spaces.Text(100).contains("go to desk 1")`` is False: it described none of the actions these envs
take. :class:`TextSpace` contains every ``str`` within its length bounds (any Unicode, as over HTTP) and samples
printable ASCII (what ``gymnasium.utils.env_checker.check_env`` and random agents draw).

The contract is the same in-process and over HTTP: a non-``str`` action is refused before the env acts on it
(``TypeError`` here; the server's request schema answers 422 for it).
"""

from __future__ import annotations

import string
from typing import Any

from gymnasium import spaces

__all__ = ["TextSpace", "check_action"]


class TextSpace(spaces.Text):
    """Any ``str`` of ``min_length`` to ``max_length`` characters (``sample()`` draws printable ASCII)."""

    def __init__(self, max_length: int, *, min_length: int = 0, charset: str = string.printable,
                 seed: int | None = None) -> None:
        super().__init__(max_length, min_length=min_length, charset=charset, seed=seed)

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and self.min_length <= len(x) <= self.max_length

    def __repr__(self) -> str:
        return f"TextSpace({self.min_length}, {self.max_length})"


def check_action(env: Any, action: Any) -> str:
    """``action`` if it is a ``str``; call first thing in ``step``.

    Raises:
        TypeError: ``action`` is not a ``str`` (the env's state is untouched; over HTTP this is a 422).
    """
    if not isinstance(action, str):
        raise TypeError(f"{type(env).__name__}.step takes a str action (action_space {env.action_space}), "
                        f"got {type(action).__name__}: {action!r:.80}")
    return action
