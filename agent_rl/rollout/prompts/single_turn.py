"""Single-turn math and code prompts: the problem from ``info["problem"]`` (else ``info["prompt"]``, else the
observation) plus one instruction; the answer is the whole response (math: final answer in ``\\boxed{}``, which the
env extracts; code: a fenced python block), passed to the env with its lines intact (``raw_actions``)."""

from __future__ import annotations

from typing import Any

from agent_rl.rollout.prompts.base import Message, TurnContext, register_prompt


class MathPrompt:
    system = "You are a careful mathematician."
    instruction = "Please reason step by step, and put your final answer within \\boxed{}."
    tool_instruction = ("You can run Python programs with the python tool. Please reason step by step, and put your "
                        "final answer within \\boxed{} in a reply that calls no tool.")
    raw_actions = True

    def task_text(self, observation: str, info: dict[str, Any]) -> str:
        return str(info.get("problem") or info.get("prompt") or observation).strip()

    def messages(self, ctx: TurnContext) -> list[Message]:
        return [{"role": "system", "content": self.system},
                {"role": "user", "content": f"{ctx.task}\n\n{self.instruction}"}]

    def followup(self, ctx: TurnContext) -> str:
        return ctx.observation


class CodePrompt(MathPrompt):
    system = "You are an expert Python programmer."
    instruction = "Write the complete Python solution in a single ```python code block."
    tool_instruction = ("You can run Python programs with the python tool to test your code. When done, write the "
                        "complete Python solution in a single ```python code block in a reply that calls no tool.")


@register_prompt("math")
def _math() -> MathPrompt:
    return MathPrompt()


@register_prompt("code")
def _code() -> CodePrompt:
    return CodePrompt()
