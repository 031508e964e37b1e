"""Prompt formats, one module per env family (``alfworld``, ``webshop``, ``textworld``, ``math``/``code``,
``generic``)."""

from agent_rl.rollout.prompts import alfworld, generic, react, single_turn, textworld, webshop  # noqa: F401  (registration)
from agent_rl.rollout.prompts.base import (
    PromptFormat,
    TurnContext,
    get_prompt,
    register_prompt,
    render,
    render_followup,
    render_text,
)
from agent_rl.rollout.prompts.encoding import ChatTemplateError, UnsafeTokenizerError, encode_data, format_ids

__all__ = ["ChatTemplateError", "PromptFormat", "TurnContext", "UnsafeTokenizerError", "encode_data", "format_ids",
           "get_prompt", "register_prompt", "render", "render_followup", "render_text"]
