"""Prompt formats, one module per env family (``alfworld``, ``webshop``, ``textworld``, ``math``/``code``,
``generic``)."""

from agent_rl.rollout.prompts import alfworld, generic, react, single_turn, textworld, webshop  # noqa: F401  (registration)
from agent_rl.rollout.prompts.base import (
    PromptFormat,
    TurnContext,
    get_prompt,
    register_prompt,
    render,
    render_text,
    turn_separator,
    user_turn_text,
)

__all__ = ["PromptFormat", "TurnContext", "get_prompt", "register_prompt", "render", "render_text",
           "turn_separator", "user_turn_text"]
