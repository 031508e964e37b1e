"""The tools-mode conversation (``env.action_format=tools``) of any env family's prompt.

:class:`ToolPrompt` wraps the env family's text-mode :class:`~agent_rl.rollout.prompts.base.PromptFormat`: the first
user message is the family's own (task, observation, admissible actions) with its answer instructions replaced by
tool-calling ones (``tool_instructions`` / ``tool_instruction`` / ``tool_system`` of the family, when it has them);
the history window is the real conversation: each past turn is an assistant message with its ``tool_calls`` and a
``tool`` message with the env's answer (the family's ``followup`` text for the current turn: observation and
admissible actions). How the tools, calls and tool messages are shown is the chat template's business
(:func:`agent_rl.rollout.tool_calls.tool_messages`). An episode without tools (math without ``env.tools``) is the family's
text prompt unchanged.
"""

from __future__ import annotations

import copy
from typing import Any

from agent_rl.rollout.prompts.base import Message, PromptFormat, TurnContext
from agent_rl.rollout.tool_calls import ToolCallFormat, assistant_message

TOOL_INSTRUCTIONS = "Think step by step if it helps, then act: call exactly one of the tools."


class ToolPrompt:
    """Tools-mode messages over ``base`` (see the module docstring); ``fmt`` writes past calls back."""

    def __init__(self, base: PromptFormat, fmt: ToolCallFormat) -> None:
        self.text = base
        self.base = copy.copy(base)
        self.fmt = fmt
        self.raw_actions = bool(getattr(base, "raw_actions", False))
        if hasattr(base, "tool_instruction"):  # math / code: one instruction sentence
            self.base.instruction = base.tool_instruction  # type: ignore[attr-defined]
        else:
            self.base.instructions = getattr(base, "tool_instructions", TOOL_INSTRUCTIONS)  # type: ignore[attr-defined]
        if hasattr(base, "tool_system"):
            self.base.system = base.tool_system  # type: ignore[attr-defined]

    def task_text(self, observation: str, info: dict[str, Any]) -> str:
        return self.base.task_text(observation, info)

    def messages(self, ctx: TurnContext) -> list[Message]:
        if not ctx.tools:
            return self.text.messages(ctx)
        if not ctx.history:
            return self.base.messages(ctx)
        first = TurnContext(task=ctx.task, observation=ctx.history[0][0], admissible=None, history=[],
                            step=ctx.step - len(ctx.history), info={}, tools=ctx.tools)
        messages = list(self.base.messages(first))
        for j, (_, action) in enumerate(ctx.history):
            messages.append(assistant_message(action, self.fmt))
            answer = ctx.history[j + 1][0].strip() if j + 1 < len(ctx.history) else self.followup(ctx)
            messages.append({"role": "tool", "content": answer})
        return messages

    def followup(self, ctx: TurnContext) -> str:
        return self.base.followup(ctx) if ctx.tools else self.text.followup(ctx)
