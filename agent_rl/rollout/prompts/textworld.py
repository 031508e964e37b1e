"""TextWorld prompt (coin collector, treasure hunter, cooking): the game's objective as the task, the recent turns,
the current observation, the admissible commands, ``<think>``/``<action>`` answer (the ALFWorld layout)."""

from __future__ import annotations

from typing import Any

from agent_rl.rollout.prompts.alfworld import ALFWorldPrompt
from agent_rl.rollout.prompts.base import register_prompt


class TextWorldPrompt(ALFWorldPrompt):
    system = "You are an expert player of text adventure games (TextWorld). Reach the goal in as few steps as possible."

    def task_text(self, observation: str, info: dict[str, Any]) -> str:
        objective = info.get("objective")
        if isinstance(objective, str) and objective.strip():
            return " ".join(objective.split())
        return observation.strip().split("\n\n")[0]


@register_prompt("textworld")
def _textworld() -> TextWorldPrompt:
    return TextWorldPrompt()
