"""Each env family describes itself once, as plain data: its evaluation panels, default split, split sizes, the
info key of its task type and the constructor kwarg of its expert.

The evaluation (``agent_rl.eval``: panels, reference policies, the in-training panel) and behaviour cloning
(``agent_rl.sft``: which kwarg turns ``info["expert_action"]`` on) read an :class:`EnvFamily` instead of branching on
family names, so a new env touches no file of ``agent_rl/eval/``: it describes itself in its own package
(``envs/<family>/family.py``, listed in :data:`BUILTIN` by env id, loaded on first use) or, for a user's env, by
calling :func:`register_family` in the module that registers its gymnasium id (``env_server.imports`` /
``trainer.imports``). An env that describes nothing gets :func:`describe`'s default (no panels; the expert, if any,
behind ``expert=True``).

This module imports nothing of ``agent_rl`` (and nothing of any environment until a description is asked for).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

__all__ = ["BUILTIN", "EnvFamily", "describe", "family_of", "register_family"]


@dataclass(frozen=True)
class EnvFamily:
    """What evaluation and behaviour cloning need to know about an env family.

    A panel task is the reset options ``{split_key: split, index_key: i}`` for ``i`` in ``range(split_size(split))``.
    """

    name: str
    """Short name: panel names are ``<name>_<split>`` (``alfworld_valid_unseen``)."""
    env_id: str
    """The gymnasium id the description belongs to."""
    default_split: str = ""
    """The panel evaluated when none is given (``eval.split`` / ``trainer.eval_panel``); "" = no panels."""
    split_key: str = "split"
    """The reset option that names a task's split (``split``; ``dataset`` for math and code)."""
    index_key: str = "index"
    """The reset option that names a task's index within its split."""
    split_aliases: Mapping[str, str] = field(default_factory=dict)
    """Panel split name -> the env's own name (WebShop's held-out goals are its paper's ``test``, the env's ``val``)."""
    split_size: Callable[[str, str | None], int] | None = None
    """``(env split, data root or None) -> number of tasks``; raises ``ValueError`` / ``KeyError`` naming the valid
    splits, ``FileNotFoundError`` naming the data path looked for. None: no panels."""
    task_types: Callable[[str, str | None], list[str]] | None = None
    """``(env split, data root) -> task type of every index``, when known before playing (ALFWorld: the game path)."""
    canonical_split: Callable[[str], str] | None = None
    """Name of the data behind a split name (math: ``math_train_deepscaler`` -> ``math_train``): an eval panel must
    not be the training data under another name. None: names are canonical."""
    task_type_kwarg: str = ""
    """Constructor kwarg restricting the selectable tasks to some task types (ALFWorld: ``task_types``); indices
    then run over the tasks of those types in their split order, so a panel of an env made with it is drawn from
    them (``agent_rl.eval.runner.build_panels``). "" = none."""
    task_type_key: str = "task_type"
    """The ``info`` key holding an episode's task type (per-type success rates)."""
    expert_kwarg: str = ""
    """Constructor kwarg that turns ``info["expert_action"]`` on (the expert reference row, behaviour cloning);
    "" = the family has no expert."""
    state_expert: bool = False
    """The expert labels any state the env can reach, not only the states of its own episodes (ALFWorld's handcoded
    expert re-plans from the game's facts), so DAgger (``trainer.warm_start=dagger``) can ask it about the states a
    policy reached. TextWorld's walkthrough and WebShop's oracle follow their own episode: False."""
    expert_gave_up: str = ""
    """The action the expert says when it has none for a state (ALFWorld: ``look``, its fallback when the handcoded
    expert fails or gives up); DAgger drops such labels. "" = the expert always answers."""
    admissible_actions: bool = False
    """The env lists ``info["admissible_actions"]`` (the random reference policy draws from them)."""
    score: bool = False
    """The episode reward is a score in [0, 1] worth reporting beside success (WebShop: ``score`` = 100 x mean
    reward, and per task type, which are the goals' categories, ``per_category``)."""
    answer_accuracy: bool = False
    """Single-answer tasks (math, code): the results also name success ``accuracy``."""
    deterministic: Callable[[Mapping[str, Any]], bool] | None = None
    """``(env kwargs) -> whether an episode is reproduced exactly by resetting with its seed and options and replaying
    its actions`` (forked groups, ``rollout.fork`` with ``restore=replay``: False refuses forking up front; True or
    None: forks are made and every replayed turn is still checked; ``restore=state`` copies the env's state instead
    and does not read it). None: not declared."""

    @property
    def has_panels(self) -> bool:
        return bool(self.default_split) and self.split_size is not None

    def env_split(self, split: str) -> str:
        """The env's own name of panel split ``split`` (:attr:`split_aliases`)."""
        return self.split_aliases.get(split, split)

    def canonical(self, split: str | None) -> str | None:
        """:attr:`canonical_split` of ``split`` (``split`` itself when names are canonical or it is None)."""
        if split is None or self.canonical_split is None:
            return split
        return self.canonical_split(split)


def replays_exactly(env_kwargs: Mapping[str, Any]) -> bool:
    """:attr:`EnvFamily.deterministic` of the text envs whose state is a function of the task, the reset seed and the
    actions so far (TextWorld, ALFWorld, WebShop), whatever their kwargs."""
    return True


#: built-in env id -> ``"module:ATTRIBUTE"`` of its description (imported on first use, as gymnasium entry points).
BUILTIN: dict[str, str] = {
    "agent_rl/ALFWorld-v0": "envs.alfworld.family:FAMILY",
    "agent_rl/WebShop-v0": "envs.webshop.family:FAMILY",
    "agent_rl/TextWorld-v0": "envs.textworld.family:FAMILY",
    "agent_rl/Math-v0": "envs.math.family:FAMILY",
    "agent_rl/Code-v0": "envs.code.family:FAMILY",
}

_REGISTRY: dict[str, EnvFamily] = {}


def register_family(family: EnvFamily) -> None:
    """Describe ``family.env_id`` (a user's env: call it where the gymnasium id is registered).

    Raises:
        ValueError: the id is described already (a built-in, or a second registration).
    """
    if family.env_id in _REGISTRY or family.env_id in BUILTIN:
        raise ValueError(f"env id {family.env_id!r} is already described (envs.families); one description per id")
    _REGISTRY[family.env_id] = family


def family_of(env_id: str) -> EnvFamily | None:
    """The registered description of ``env_id`` (a built-in's is imported on first use), or None."""
    if env_id not in _REGISTRY and env_id in BUILTIN:
        module, _, attr = BUILTIN[env_id].partition(":")
        _REGISTRY[env_id] = getattr(importlib.import_module(module), attr)
    return _REGISTRY.get(env_id)


def describe(env_id: str, name: str = "") -> EnvFamily:
    """:func:`family_of` ``env_id``, else the default description of an env that registers none: named ``name`` (or
    the id's last part), no panels, an expert (if it has one) behind ``expert=True``, ``info["task_type"]``."""
    found = family_of(env_id)
    if found is not None:
        return found
    return EnvFamily(name=name or env_id.rsplit("/", 1)[-1].split("-v")[0].lower(), env_id=env_id,
                     expert_kwarg="expert")
