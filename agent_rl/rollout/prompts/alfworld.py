"""ALFWorld prompt (docs/alfworld.md, "Conventions used by published agent-RL results"): task, step count, the last
``history_length`` turns, the current observation, the admissible actions, ``<think>``/``<action>`` answer."""

from __future__ import annotations

from typing import Any

from agent_rl.rollout.prompts.base import ACTION_INSTRUCTIONS, Message, TurnContext, format_history, register_prompt
from agent_rl.rollout.prompts.generic import GenericPrompt


class ALFWorldPrompt(GenericPrompt):
    system = "You are an expert household agent in the ALFRED text environment (ALFWorld)."
    instructions = ACTION_INSTRUCTIONS + " The action must be one of the admissible actions."
    tool_instructions = ("Think step by step if it helps, then call the act tool once, with one of the admissible "
                         "actions as its command.")

    def task_text(self, observation: str, info: dict[str, Any]) -> str:
        # The reset observation ends with "Your task is to: <goal>."; keep the goal sentence only.
        return super().task_text(observation, info).splitlines()[0].strip()

    def messages(self, ctx: TurnContext) -> list[Message]:
        parts = [f"Your task is to: {ctx.task}"]
        if ctx.history:
            parts.append(
                f"You have taken {ctx.step} step(s) so far. Your last {len(ctx.history)} observation(s) and "
                f"action(s):\n{format_history(ctx.history, ctx.step)}"
            )
        parts.append(f"Now at step {ctx.step + 1}, your observation is: {ctx.observation.strip()}")
        if ctx.admissible:
            parts.append("Admissible actions: [" + ", ".join(ctx.admissible) + "].")
        parts.append(self.instructions)
        return [{"role": "system", "content": self.system}, {"role": "user", "content": "\n\n".join(parts)}]


class ALFWorldGoalPrompt(ALFWorldPrompt):
    """:class:`ALFWorldPrompt` whose full-trajectory follow-ups end with the goal again (``env.prompt=alfworld_goal``):
    each new user turn is the observation, the admissible actions, then ``Your task is to: <goal>``, so the goal
    sits next to the answer being written at every turn, not only in the first message of a row that grows by
    ~100-150 tokens a turn. Per-turn mode is unchanged (its every prompt starts with the goal)."""

    def followup(self, ctx: TurnContext) -> str:
        return f"{super().followup(ctx)}\nYour task is to: {ctx.task}"


@register_prompt("alfworld")
def _alfworld() -> ALFWorldPrompt:
    return ALFWorldPrompt()


@register_prompt("alfworld_goal")
def _alfworld_goal() -> ALFWorldGoalPrompt:
    return ALFWorldGoalPrompt()
