"""Prompt formats: one module per env family, one registry, one chat rendering.

A format turns what the orchestrator knows at a turn (:class:`TurnContext`) into chat messages; :func:`render` turns
messages into prompt token ids with the tokenizer's own chat template (a plain ``role: content`` layout when the
tokenizer has none). Generated text is never re-rendered: only prompts go through here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

Message = dict[str, str]


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
    """

    task: str
    observation: str
    admissible: list[str] | None = None
    history: list[tuple[str, str]] = field(default_factory=list)
    step: int = 0
    info: dict[str, Any] = field(default_factory=dict)


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


def render(tokenizer: Any, messages: list[Message], *, add_generation_prompt: bool = True) -> list[int]:
    """Prompt token ids for ``messages`` via ``tokenizer.apply_chat_template`` (a plain layout without a template).

    Returns:
        list[int]: the ids the engine sees (no special tokens beyond what the template writes).
    """
    return tokenizer.encode(render_text(tokenizer, messages, add_generation_prompt=add_generation_prompt),
                            add_special_tokens=False)


def render_text(tokenizer: Any, messages: list[Message], *, add_generation_prompt: bool = True) -> str:
    """The chat-template text of ``messages`` (see :func:`render`)."""
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
    text = "".join(f"{m['role']}: {m['content']}\n" for m in messages)
    return text + ("assistant:" if add_generation_prompt else "")


def turn_separator(tokenizer: Any) -> str:
    """Text the chat template writes after an assistant message's content (e.g. ``"<|im_end|>\\n"``): in
    full-trajectory mode it closes a sampled response before the next user message."""
    probe = "\x00PROBE\x00"
    text = render_text(tokenizer, [{"role": "user", "content": "u"}, {"role": "assistant", "content": probe}],
                       add_generation_prompt=False)
    return text[text.rindex(probe) + len(probe):] if probe in text else "\n"


def user_turn_text(tokenizer: Any, content: str) -> str:
    """Text of one more user message plus the generation prompt, as the template appends it to a conversation."""
    base = [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}]
    before = render_text(tokenizer, base, add_generation_prompt=False)
    after = render_text(tokenizer, base + [{"role": "user", "content": content}], add_generation_prompt=True)
    if after.startswith(before):
        return after[len(before):]
    return f"user: {content}\nassistant:"
