"""Math's self-description (:class:`envs.families.EnvFamily`): a panel per dataset (``math500`` by default; aime24,
aime25, amc23, minerva, olympiadbench, ...), selected by the ``dataset`` reset option; dataset aliases name the same
data (``math_train_deepscaler`` is ``math_train``); single-answer tasks (``accuracy``); no expert."""

from __future__ import annotations

from typing import Any, Mapping

from envs.families import EnvFamily
from envs.math.datasets import canonical_name, load_math


def split_size(split: str, root: str | None) -> int:
    """Problems of dataset ``split`` (``KeyError`` naming the datasets)."""
    return len(load_math(split, root=root))


def canonical_split(split: str) -> str:
    """The dataset behind an alias (an unknown name is itself)."""
    try:
        return canonical_name(split)
    except KeyError:
        return split


def deterministic(env_kwargs: Mapping[str, Any]) -> bool:
    """Forked groups (``rollout.fork``): a math episode replays exactly without tools; with the python tool it is not
    assumed to (the sandbox's state and timing are not part of the observation)."""
    return not env_kwargs.get("tools") and env_kwargs.get("action_format") != "tools"


FAMILY = EnvFamily(name="math", env_id="agent_rl/Math-v0", default_split="math500", split_key="dataset",
                   split_size=split_size, canonical_split=canonical_split, answer_accuracy=True,
                   deterministic=deterministic)
