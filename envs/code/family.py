"""Code's self-description (:class:`envs.families.EnvFamily`): a panel per dataset (``humanevalplus`` by default;
humaneval, mbpp, mbpp_sanitized), selected by the ``dataset`` reset option; single-answer tasks (``accuracy``); no
expert."""

from __future__ import annotations

from envs.code.datasets import load_code
from envs.families import EnvFamily


def split_size(split: str, root: str | None) -> int:
    """Tasks of dataset ``split`` (``KeyError`` naming the datasets)."""
    return len(load_code(split, root=root))


FAMILY = EnvFamily(name="code", env_id="agent_rl/Code-v0", default_split="humanevalplus", split_key="dataset",
                   split_size=split_size, answer_accuracy=True)
