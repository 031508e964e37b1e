"""ReAct prompts (Yao et al., ICLR 2023): a short thought, then the action, after one few-shot example in the paper's
layout. ALFWorld's example uses this env's ``move X to Y`` (alfworld 0.4.2; the paper's games said ``put X in/on Y``).

The answer layout is ``Thought: <one sentence>`` then ``Action: <one admissible action>``; the one action parser
(:func:`agent_rl.rollout.parsing.parse_action`) takes the first ``Action:`` line. ``prompt=react`` in
``python -m agent_rl.eval`` selects ``react`` (ALFWorld) or ``react_webshop``.
"""

from __future__ import annotations

from agent_rl.rollout.prompts.alfworld import ALFWorldPrompt
from agent_rl.rollout.prompts.base import Message, TurnContext, format_history, register_prompt
from agent_rl.rollout.prompts.webshop import WebShopPrompt

REACT_INSTRUCTIONS = ("Answer in exactly two lines: first \"Thought: \" and one short sentence of reasoning, then "
                      "\"Action: \" and exactly one admissible action.")

ALFWORLD_EXAMPLE = """You are in the middle of a room. Looking quickly around you, you see a cabinet 1, a countertop 1, \
a drawer 1, a fridge 1, a sinkbasin 1, and a toaster 1.
Your task is to: put a cool tomato in countertop.
Thought: To solve the task, I need to find a tomato, cool it with the fridge, then move it to the countertop. A \
tomato is likely on the countertop first.
Action: go to countertop 1
Observation: On the countertop 1, you see a knife 1, and a tomato 1.
Thought: Now I find a tomato (1). Next, I need to take it.
Action: take tomato 1 from countertop 1
Observation: You pick up the tomato 1 from the countertop 1.
Thought: Now I take a tomato (1). Next, I need to go to the fridge (1) and cool it.
Action: go to fridge 1
Observation: The fridge 1 is closed.
Action: cool tomato 1 with fridge 1
Observation: You cool the tomato 1 using the fridge 1.
Thought: Now I cool the tomato (1). Next, I need to move it to the countertop 1.
Action: go to countertop 1
Observation: On the countertop 1, you see a knife 1.
Action: move tomato 1 to countertop 1
Observation: You move the tomato 1 to the countertop 1."""

WEBSHOP_EXAMPLE = """Instruction: i would like a 3 ounce bottle of bright citrus deodorant for sensitive skin, and \
price lower than 50.00 dollars
Action: search[3 ounce bright citrus deodorant sensitive skin]
Observation: [Back to Search] Page 1 (Total results: 50) [Next >] [B078GWRC1J] Bright Citrus Deodorant by Earth \
Mama | Natural and Safe for Sensitive Skin, 3-Ounce $10.99 ...
Thought: B078GWRC1J is a bright citrus deodorant for sensitive skin under 50 dollars. I can check it first.
Action: click[b078gwrc1j]
Observation: [Back to Search] [< Prev] scent [assorted scents][bright citrus][calming lavender] size [travel set \
(4-pack)][3 ounce (pack of 1)] Bright Citrus Deodorant by Earth Mama, Price: $10.99 [Buy Now]
Thought: For 3 ounce bottle of bright citrus deodorant, the item has options 'bright citrus' and '3 ounce (pack of \
1)' and seems good to buy.
Action: click[bright citrus]
Observation: You have clicked bright citrus.
Action: click[3 ounce (pack of 1)]
Observation: You have clicked 3 ounce (pack of 1).
Action: click[buy now]"""


class ReActALFWorldPrompt(ALFWorldPrompt):
    """ALFWorld with one ReAct example (the paper's ``cool`` example, ``move X to Y`` wording)."""

    example = ALFWORLD_EXAMPLE

    def messages(self, ctx: TurnContext) -> list[Message]:
        parts = [f"Here is an example of how to act:\n{self.example}\n\n(End of example.)",
                 f"Your task is to: {ctx.task}"]
        if ctx.history:
            parts.append(f"Your last {len(ctx.history)} observation(s) and action(s):\n"
                         f"{format_history(ctx.history, ctx.step)}")
        parts.append(f"Observation: {ctx.observation.strip()}")
        if ctx.admissible:
            parts.append("Admissible actions: [" + ", ".join(ctx.admissible) + "].")
        parts.append(REACT_INSTRUCTIONS)
        return [{"role": "system", "content": self.system}, {"role": "user", "content": "\n\n".join(parts)}]


class ReActWebShopPrompt(WebShopPrompt):
    """WebShop with the paper's ReAct example layout."""

    def messages(self, ctx: TurnContext) -> list[Message]:
        parts = [f"Here is an example of how to act:\n{WEBSHOP_EXAMPLE}\n\n(End of example.)",
                 f"Instruction: {ctx.task}"]
        if ctx.history:
            parts.append(f"Your last {len(ctx.history)} turn(s):\n{format_history(ctx.history, ctx.step)}")
        parts.append(f"Observation: {ctx.observation.strip()}{self._admissible(ctx)}")
        parts.append(REACT_INSTRUCTIONS)
        return [{"role": "system", "content": self.system}, {"role": "user", "content": "\n\n".join(parts)}]


@register_prompt("react")
def _react() -> ReActALFWorldPrompt:
    return ReActALFWorldPrompt()


@register_prompt("react_webshop")
def _react_webshop() -> ReActWebShopPrompt:
    return ReActWebShopPrompt()
