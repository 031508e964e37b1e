"""Generic prompt for any registered gymnasium text env (ChooseItem, Calculator, a user's env)."""

from __future__ import annotations

import re
from typing import Any

from agent_rl.rollout.prompts.base import ACTION_INSTRUCTIONS, Message, TurnContext, format_history, register_prompt

_TASK_RE = re.compile(r"your task is to:?\s*(.+)", re.IGNORECASE | re.DOTALL)


class GenericPrompt:
    """Task (``info["task"]``, "Your task is to: ..." in the first observation, else the first observation),
    history, observation, admissible actions, answer format."""

    system = "You are an agent acting in a text environment."
    instructions = ACTION_INSTRUCTIONS
    """How to answer (tools mode replaces it, :mod:`agent_rl.rollout.prompts.tool_prompt`)."""

    def task_text(self, observation: str, info: dict[str, Any]) -> str:
        if isinstance(info.get("task"), str):
            return info["task"]
        m = _TASK_RE.search(observation)
        return m.group(1).strip() if m else observation.strip()

    def _admissible(self, ctx: TurnContext) -> str:
        return f"\nAdmissible actions: [{', '.join(ctx.admissible)}]." if ctx.admissible else ""

    def messages(self, ctx: TurnContext) -> list[Message]:
        parts = [f"Your task is to: {ctx.task}"]
        if ctx.history:
            parts.append(f"Your last {len(ctx.history)} turn(s):\n{format_history(ctx.history, ctx.step)}")
        parts.append(f"Current observation (step {ctx.step + 1}): {ctx.observation.strip()}{self._admissible(ctx)}")
        parts.append(self.instructions)
        return [{"role": "system", "content": self.system}, {"role": "user", "content": "\n\n".join(parts)}]

    def followup(self, ctx: TurnContext) -> str:
        return f"{ctx.observation.strip()}{self._admissible(ctx)}"


@register_prompt("generic")
def _generic() -> GenericPrompt:
    return GenericPrompt()
