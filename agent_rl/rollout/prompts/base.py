"""Prompt formats: one module per env family, one registry, one chat rendering.

A format turns what the orchestrator knows at a turn (:class:`TurnContext`) into chat messages; :func:`render` turns
messages into prompt token ids with the tokenizer's own chat template (a plain ``role: content`` layout when the
tokenizer has none), and :func:`render_followup` gives a full-trajectory row's next user turn. Both encode message
content (env text, the history window's earlier actions) as data, never as control tokens
(:mod:`agent_rl.rollout.prompts.encoding`, docs/training.md "Env text is data"). Generated ids are never re-rendered:
only prompts go through here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from agent_rl.rollout.prompts.encoding import chat_ids, chat_segments, followup_ids

Message = dict[str, Any]  # {"role", "content": str}, and an assistant message's "tool_calls" (tools mode)


@dataclass
class TurnContext:
    """What a prompt may use at turn ``step`` (0-based) of an episode.

    Attributes:
        task: the task text (e.g. "put a clean mug in coffeemachine").
        observation: the env's latest observation.
        admissible: the admissible actions when the env lists them (``info["admissible_actions"]``), else None.
        history: the last ``history_length`` (observation, action) pairs before this turn, oldest first.
        step: number of actions already taken.
        info: the env's latest info dict.
        tools: the tools the env declared at reset (``info["tools"]``, OpenAI function schemas) in tools mode
            (``env.action_format=tools``), else None.
    """

    task: str
    observation: str
    admissible: list[str] | None = None
    history: list[tuple[str, str]] = field(default_factory=list)
    step: int = 0
    info: dict[str, Any] = field(default_factory=dict)
    tools: list[dict[str, Any]] | None = None


class PromptFormat(Protocol):
    """One env family's prompt: ``task_text`` once per episode, ``messages`` per turn (per-turn mode),
    ``followup`` for turns after the first in full-trajectory mode (the new user message only)."""

    def task_text(self, observation: str, info: dict[str, Any]) -> str: ...

    def messages(self, ctx: TurnContext) -> list[Message]: ...

    def followup(self, ctx: TurnContext) -> str: ...


_PROMPTS: dict[str, Callable[[], PromptFormat]] = {}


def register_prompt(name: str) -> Callable[[Callable[[], PromptFormat]], Callable[[], PromptFormat]]:
    """Decorator registering a prompt-format factory under ``name`` (duplicates raise ``ValueError``)."""

    def deco(factory: Callable[[], PromptFormat]) -> Callable[[], PromptFormat]:
        if name in _PROMPTS:
            raise ValueError(f"prompt format {name!r} is already registered")
        _PROMPTS[name] = factory
        return factory

    return deco


def has_prompt(name: str) -> bool:
    """Whether a prompt format ``name`` is registered."""
    return name in _PROMPTS


def get_prompt(name: str) -> PromptFormat:
    """The prompt format registered as ``name``; ``ValueError`` lists the valid names."""
    if name not in _PROMPTS:
        raise ValueError(f"unknown prompt format {name!r}; valid: {sorted(_PROMPTS)}")
    return _PROMPTS[name]()


ACTION_INSTRUCTIONS = (
    "First think step by step inside <think> </think>, then give exactly one action inside <action> </action>."
)


def format_history(history: list[tuple[str, str]], step: int) -> str:
    """Numbered "[Observation k] ... [Action k] ..." lines of the recent turns."""
    first = step - len(history) + 1
    lines = []
    for k, (obs, act) in enumerate(history, start=first):
        lines.append(f"[Observation {k}] {obs.strip()}\n[Action {k}] {act}")
    return "\n".join(lines)


def render(tokenizer: Any, messages: list[Message], *, add_generation_prompt: bool = True,
           tools: list[dict[str, Any]] | None = None) -> list[int]:
    """Prompt token ids for ``messages``, rendered by ``tokenizer``'s chat template (a plain ``role: content`` layout
    without one), every message's content encoded as data: a special token's string in it (``<|im_end|>``, BOS/EOS)
    is encoded as the characters it spells, the template's own markers are the special ids
    (:mod:`agent_rl.rollout.prompts.encoding`).

    Args:
        tokenizer: a Hugging Face tokenizer (or any ``encode``/``decode`` tokenizer without special tokens).
        messages: ``[{"role": ..., "content": str}, ...]``.
        add_generation_prompt: end with the template's generation prompt (the start of the assistant turn).
        tools: OpenAI function schemas passed to the template as ``tools=`` (their text is data too); the template
            must render them (:func:`agent_rl.rollout.tool_calls.tool_messages` moves them into the system prompt for
            templates that cannot).

    Returns:
        list[int]: the ids the engine sees (no special tokens beyond what the template writes).

    Raises:
        ChatTemplateError: the template rewrites message content or drops/repeats a message (names the template).
        UnsafeTokenizerError: the tokenizer ignores ``split_special_tokens``.
    """
    return chat_ids(tokenizer, messages, add_generation_prompt=add_generation_prompt, tools=tools)


def render_followup(tokenizer: Any, content: str, *, role: str = "user",
                    tools: list[dict[str, Any]] | None = None) -> list[int]:
    """Full-trajectory follow-up: the ids the chat template writes after a (sampled) assistant response for one more
    message ``content`` (data; ``role`` ``user``, or ``tool`` for the env's answer to a tool call) plus the generation
    prompt (:func:`~agent_rl.rollout.prompts.encoding.followup_ids`; Qwen3-style reasoning templates included, a
    template that cannot be spliced raises ``ChatTemplateError``)."""
    return followup_ids(tokenizer, content, role=role, tools=tools)


def render_text(tokenizer: Any, messages: list[Message], *, add_generation_prompt: bool = True) -> str:
    """The text of ``messages`` as :func:`render` lays it out (for display; ids only come from :func:`render`)."""
    return "".join(text for text, _ in chat_segments(tokenizer, messages, add_generation_prompt=add_generation_prompt))
