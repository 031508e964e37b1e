"""What a client may send the gateway: the bounds (:class:`GatewayLimits`) and the checks of one request against
them. Each check raises :class:`~agent_rl.gateway.recorder.RequestError` (an OpenAI-shaped error) and changes
nothing."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from agent_rl.gateway.recorder import GatewaySession, PromptBuilder, RequestError
from envs.hosting.jsonable import lone_surrogate


@dataclass
class GatewayLimits:
    """Bounds of what a client may send (``env.external.*`` in training)."""

    max_body_bytes: int = 4 * 1024 * 1024
    max_messages: int = 512
    max_tools: int = 64
    max_requests: int = 64
    """Model calls per episode; more is 429 ``turn_budget_exhausted``."""
    max_prompt_tokens: int = 8192
    max_new_tokens: int = 256
    """The cap of every call's ``max_tokens`` (the run's ``engine.max_new_tokens``)."""


def check_text(body: BaseModel) -> None:
    """Refuse a body with a lone UTF-16 surrogate (legal JSON, not text: no tokenizer encodes it, no reply could
    echo it): 400 ``invalid_text`` naming the field, as the env servers do (``envs.hosting.jsonable``)."""
    found = lone_surrogate(body.model_dump(), "body")
    if found:
        raise RequestError(found, "invalid_text")


def check_counts(limits: GatewayLimits, messages: list[Any], tools: list[Any] | None) -> None:
    """Refuse more messages or tools than ``limits`` allow: 400 ``too_many_messages`` / ``too_many_tools``."""
    if len(messages) > limits.max_messages:
        raise RequestError(f"{len(messages)} messages; at most {limits.max_messages}", "too_many_messages")
    if tools is not None and len(tools) > limits.max_tools:
        raise RequestError(f"{len(tools)} tools; at most {limits.max_tools}", "too_many_tools")


def capped(limits: GatewayLimits, requested: int | None) -> int:
    """A call's ``max_tokens`` under the run's cap (the cap when none is asked)."""
    cap = limits.max_new_tokens
    return cap if requested is None else min(int(requested), cap)


def check_call_allowed(session: GatewaySession) -> None:
    """Refuse a model call the session cannot take now: 409 ``session_busy`` (one at a time), 409 ``episode_over``
    (its reward is posted), 429 ``turn_budget_exhausted``."""
    if session.busy:
        raise RequestError("another request of this session is running (one at a time)", "session_busy", 409)
    if session.reward is not None:
        raise RequestError("the episode's reward is posted: the episode is over, no more calls",
                           "episode_over", 409)
    if session.requests >= session.max_requests:
        raise RequestError(f"the episode's {session.max_requests} model calls are used", "turn_budget_exhausted",
                           429)


def check_text_size(limits: GatewayLimits, builder: PromptBuilder, texts: list[str]) -> None:
    """Refuse text that cannot fit the prompt budget before it is rendered and encoded (encoding 4 MiB held the
    event loop, which serves every session and the generation batcher, for ~8 s): 400
    ``context_length_exceeded``."""
    fewest = builder.fewest_tokens(texts)
    if fewest > limits.max_prompt_tokens:
        raise RequestError(f"the prompt is at least {fewest} tokens; at most {limits.max_prompt_tokens}",
                           "context_length_exceeded")


def check_prompt(limits: GatewayLimits, prompt_ids: list[int]) -> None:
    """Refuse an encoded prompt over ``limits.max_prompt_tokens``: 400 ``context_length_exceeded``."""
    if len(prompt_ids) > limits.max_prompt_tokens:
        raise RequestError(f"the prompt is {len(prompt_ids)} tokens; at most {limits.max_prompt_tokens}",
                           "context_length_exceeded")
