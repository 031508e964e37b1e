"""WebShop prompt: the instruction, the page (observation, ``observation_mode="text"``), the clickables/search
actions the env lists as admissible, ``<action>search[...]</action>`` / ``<action>click[...]</action>``."""

from __future__ import annotations

from typing import Any

from agent_rl.rollout.prompts.base import register_prompt
from agent_rl.rollout.prompts.generic import GenericPrompt


class WebShopPrompt(GenericPrompt):
    system = (
        "You are a web shopping agent. Actions are search[<query>] and click[<button or product>]; buy the product "
        "that matches the instruction."
    )
    tool_system = ("You are a web shopping agent. Use the search and click tools to find and buy the product that "
                   "matches the instruction.")

    def task_text(self, observation: str, info: dict[str, Any]) -> str:
        for key in ("instruction", "goal", "task"):
            if isinstance(info.get(key), str):
                return info[key]
        return observation.strip().splitlines()[0] if observation.strip() else ""


@register_prompt("webshop")
def _webshop() -> WebShopPrompt:
    return WebShopPrompt()
