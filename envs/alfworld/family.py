"""ALFWorld's self-description (:class:`envs.families.EnvFamily`): panels ``valid_seen`` (140 games) /
``valid_unseen`` (134, the default) / ``train``, task types known from the game paths, the handcoded expert behind
``expert=True``, admissible actions listed."""

from __future__ import annotations

from envs.alfworld.data import list_games, task_type_of
from envs.families import EnvFamily, replays_exactly


def split_size(split: str, root: str | None) -> int:
    """Games in ``split`` (``ValueError`` naming the splits; ``EnvDataError`` naming the folder looked for)."""
    return len(list_games(split, root=root))


def task_types(split: str, root: str | None) -> list[str]:
    """The task type of every game of ``split``, by index (from its folder name)."""
    return [task_type_of(game) for game in list_games(split, root=root)]


FAMILY = EnvFamily(deterministic=replays_exactly, name="alfworld", env_id="agent_rl/ALFWorld-v0", default_split="valid_unseen", split_key="split",
                   split_size=split_size, task_types=task_types, task_type_kwarg="task_types", expert_kwarg="expert",
                   state_expert=True, expert_gave_up="look", admissible_actions=True)
