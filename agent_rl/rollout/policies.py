"""Reference policies: scripted players a :class:`~agent_rl.rollout.episode.ScriptedEpisode` asks instead of the
engine (``policy=``), on the one episode path training uses: the random lower bound and the env's expert (the
evaluation's reference rows, ``agent_rl.eval``), and the expert whose turns behaviour cloning trains on
(``agent_rl.sft``: the response is the expert action rendered as the RL parser reads it).

A policy answers a turn with :meth:`ScriptedPolicy.respond`: ``(action, Generation)``. The action goes to the env as
given (a scripted action is already the env's own string: it is never parsed); the generation is what the episode
stores as the turn's response (token ids and log-probs; empty ids for a reference row, the rendered expert response
for behaviour cloning).
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from agent_rl.engines.base import EngineBase
from agent_rl.rollout.prompts import TurnContext
from agent_rl.types import Generation, Task
from envs.families import EnvFamily

__all__ = ["ExpertPolicy", "RandomPolicy", "ScriptedEngine", "ScriptedPolicy", "make_policy"]


class ScriptedPolicy:
    """A policy that answers turns in place of the engine. Subclasses implement :meth:`act`."""

    def act(self, ctx: TurnContext, task: Task, slot: int) -> str:
        """The env action of turn ``ctx.step`` of the episode in ``slot`` of ``task``'s group."""
        raise NotImplementedError

    def respond(self, ctx: TurnContext, task: Task, slot: int) -> tuple[str, Generation]:
        """``(action, generation)`` of the turn: :meth:`act`'s action, and as the stored response its text in the
        RL action format with no token ids (a reference row trains nothing)."""
        action = self.act(ctx, task, slot)
        return action, Generation(token_ids=[], logprobs=[], text=f"<action>{action}</action>", finish_reason="stop")


class RandomPolicy(ScriptedPolicy):
    """Uniform over the admissible actions (lower bound); turn t of task i, sample j draws from
    ``default_rng([seed, i, j, t])``, so a run is reproducible whatever the episodes' interleaving. WebShop lists
    its search box as the placeholder ``search[<query>]``: the random policy types the task's instruction there
    (searching the literal text "<query>" finds no product, which would make every episode score 0)."""

    def __init__(self, seed: int = 0) -> None:
        self.seed = int(seed)

    def act(self, ctx: TurnContext, task: Task, slot: int) -> str:
        if not ctx.admissible:
            raise ValueError("policy=random needs an env that lists admissible actions (ALFWorld, WebShop)")
        rng = np.random.default_rng([self.seed, task.group_id, slot, ctx.step])
        action = str(ctx.admissible[int(rng.integers(len(ctx.admissible)))])
        return f"search[{ctx.task}]" if action == "search[<query>]" else action


class ExpertPolicy(ScriptedPolicy):
    """The env's own expert, ``info["expert_action"]`` (env made with its family's expert kwarg): ALFWorld's fixed
    handcoded expert, WebShop's scripted oracle, TextWorld's walkthrough and planner.

    Args:
        render: ``action -> response token ids`` (behaviour cloning: ``sft.response_template`` filled with the
            action, plus EOS); the turn then stores them with log-probs 0. None: no ids (a reference row).

    Raises (from :meth:`act`):
        RuntimeError: the env gives no ``info["expert_action"]`` (it has no expert, or was not made with its
            expert kwarg).
    """

    def __init__(self, render: Callable[[str], list[int]] | None = None) -> None:
        self.render = render

    def act(self, ctx: TurnContext, task: Task, slot: int) -> str:
        if "expert_action" not in ctx.info:
            raise RuntimeError(f"env {task.env_id} gave no info['expert_action'] (made with {task.env_kwargs}): it "
                               "has no expert, or its expert kwarg is not set (envs.families, sft.expert_kwarg)")
        return str(ctx.info["expert_action"])

    def respond(self, ctx: TurnContext, task: Task, slot: int) -> tuple[str, Generation]:
        action, gen = super().respond(ctx, task, slot)
        if self.render is not None:
            ids = list(self.render(action))
            gen = Generation(token_ids=ids, logprobs=[0.0] * len(ids), text=gen.text, finish_reason="stop")
        return action, gen


def make_policy(name: str, family: EnvFamily, seed: int) -> ScriptedPolicy | None:
    """The reference policy ``name`` (``eval.policy``) for an env ``family``: None for ``model`` (the engine);
    ``random`` needs listed admissible actions; ``expert`` and ``oracle`` both name the env's expert.

    Raises:
        ValueError: the family has no such reference (no admissible actions, no expert).
    """
    if name == "model":
        return None
    if name == "random":
        if not family.admissible_actions:
            raise ValueError(f"policy=random needs admissible actions; {family.name} lists none")
        return RandomPolicy(seed)
    if family.expert_kwarg:
        return ExpertPolicy()
    raise ValueError(f"policy={name}: {family.name} has no scripted reference policy (valid: model)")


class ScriptedEngine(EngineBase):
    """Stands in for the engine when a scripted policy plays every turn: only the tokenizer is used (prompts are
    still rendered, so the prompt budget applies as in training)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.eos_token_ids = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []

    def generate(self, *args: Any, **kwargs: Any) -> list[Generation]:  # never called under a scripted policy
        raise RuntimeError("a scripted policy does not generate")
