"""The OpenAI wire format the gateway reads (pydantic): chat completions, completions, and the reward a program posts.

Unknown fields are accepted (clients send many) and recorded; the sampling fields a client may send
(:data:`IGNORED_SAMPLING`) are recorded per call and never applied: sampling is the trainer's (docs/gateway.md).
Sizes are bounded here and by the body guard (``servers.middleware.BodyGuardMiddleware``).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from envs.numbers import checked_reward

#: request fields that would change sampling: recorded (``GatewaySession.ignored``) and ignored
IGNORED_SAMPLING = ("temperature", "top_p", "top_k", "n", "seed", "logit_bias", "logprobs", "top_logprobs",
                    "presence_penalty", "frequency_penalty", "repetition_penalty", "stop", "min_p", "best_of",
                    "response_format", "parallel_tool_calls", "tool_choice")

_NAME = r"^[A-Za-z0-9_.:-]{1,64}$"


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class FunctionCall(_Open):
    name: str = Field(max_length=64)
    arguments: str | dict[str, Any] | None = None


class ToolCall(_Open):
    id: str | None = Field(default=None, max_length=128)
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Open):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    tool_calls: list[ToolCall] | None = Field(default=None, max_length=16)
    tool_call_id: str | None = Field(default=None, max_length=128)
    name: str | None = Field(default=None, max_length=64)


class FunctionSpec(_Open):
    name: str = Field(pattern=_NAME)
    description: str | None = Field(default=None, max_length=8192)
    parameters: dict[str, Any] | None = None


class ToolSpec(_Open):
    type: Literal["function"] = "function"
    function: FunctionSpec


class ChatCompletionRequest(_Open):
    """``POST /v1/chat/completions``. ``model``: any name (it names the run's policy)."""

    model: str = Field(default="policy", max_length=256)
    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[ToolSpec] | None = None
    tool_choice: Any = None
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    stream: bool = False
    stream_options: dict[str, Any] | None = None


class CompletionRequest(_Open):
    """``POST /v1/completions``: a text prompt (one string; its text is data, never control tokens)."""

    model: str = Field(default="policy", max_length=256)
    prompt: str
    max_tokens: int | None = Field(default=None, ge=1)
    stream: bool = False


class RewardRequest(BaseModel):
    """``POST /sessions/<id>/reward``: the episode's reward (a JSON number: not a string, not a boolean; finite and
    within float32, :func:`envs.numbers.checked_reward`) and optional info."""

    model_config = ConfigDict(extra="forbid")
    reward: Annotated[float, Field(strict=True, allow_inf_nan=False),
                      AfterValidator(lambda r: checked_reward(r, "the posted reward"))]
    info: dict[str, Any] = Field(default_factory=dict)
    won: bool | None = None


class StepRequest(BaseModel):
    """``POST /env/sessions/<id>/step`` (the env server's body): one action."""

    model_config = ConfigDict(extra="forbid")
    action: str


def ignored_fields(body: BaseModel) -> dict[str, Any]:
    """The sampling fields of a request that the gateway records and does not apply."""
    data = body.model_dump(exclude_unset=True)
    return {k: data[k] for k in IGNORED_SAMPLING if k in data}
