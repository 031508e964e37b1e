"""WebShop's self-description (:class:`envs.families.EnvFamily`): panel ``test`` (the paper's held-out goals 0..499,
the env's ``val`` split, the default), ``train``, ``all``; the scripted oracle behind ``expert=True``; the score (100 x
mean reward) reported beside success, per goal category (the env's ``task_type``)."""

from __future__ import annotations

from envs.families import EnvFamily, replays_exactly
from envs.webshop.catalog import get_catalog
from envs.webshop.env import SPLITS, VAL_GOALS


def split_size(split: str, root: str | None) -> int:
    """Goals in ``split`` (``ValueError`` naming the splits)."""
    if split not in SPLITS:
        raise ValueError(f"unknown WebShop split {split!r}; valid: test (= val), {', '.join(SPLITS)}")
    n = len(get_catalog(root).goals)
    return {"val": min(VAL_GOALS, n), "train": max(n - VAL_GOALS, 0), "all": n}[split]


FAMILY = EnvFamily(deterministic=replays_exactly, name="webshop", env_id="agent_rl/WebShop-v0", default_split="test", split_key="split",
                   split_aliases={"test": "val"}, split_size=split_size, expert_kwarg="expert",
                   admissible_actions=True, score=True)
