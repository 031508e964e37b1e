"""Request and response bodies of the env server (the OpenAPI schema is generated from these).

Bodies are strict (no type coercion, no unknown fields): ``{"action": 3}`` or ``{"seed": "1"}`` is a 422, and
every string in a request body (nested ``options``/``env_kwargs`` keys and values included) must be valid Unicode:
a lone UTF-16 surrogate (``"\\ud800"``, legal JSON) is a 422 naming where it is (``docs/servers.md``, "Text").
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from envs.hosting.jsonable import lone_surrogate

__all__ = [
    "CreateSessionRequest",
    "CreateSessionResponse",
    "EnvEntry",
    "EnvsResponse",
    "ErrorResponse",
    "HealthResponse",
    "ResetRequest",
    "ResetResponse",
    "SessionInfo",
    "SessionsResponse",
    "StepRequest",
    "StepResponse",
    "UnprocessableResponse",
]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    @field_validator("*", mode="before")
    @classmethod
    def _valid_unicode(cls, value: Any, info: ValidationInfo) -> Any:
        """Refuse a lone UTF-16 surrogate anywhere in the field (before its own checks: the clearer message)."""
        found = lone_surrogate(value, info.field_name or "")
        if found:
            raise ValueError(found)
        return value


class CreateSessionRequest(_Strict):
    """Open a session: ``gymnasium.make(env_id, **env_kwargs)`` then ``reset(seed=seed, options=options)``."""

    env_id: str = Field(description="registered gymnasium id, e.g. agent_rl/ALFWorld-v0", examples=["agent_rl/Calculator-v0"])
    seed: int | None = Field(default=None, description="seed of the first reset")
    options: dict[str, Any] | None = Field(default=None, description="reset options selecting the task, e.g. {split, index}")
    env_kwargs: dict[str, Any] | None = Field(default=None, description="keyword arguments of gymnasium.make, e.g. {expert: true}")
    session_id: str | None = Field(
        default=None, pattern=r"^[A-Za-z0-9_-]{16,64}$",
        description="id chosen by the client (e.g. a uuid4 hex; default: the server picks one), so that a client "
                    "that never got the answer (timeout, dropped connection) can still close the session; "
                    "409 session_exists if a live session of this client has it (each client's ids are its own)")


class ResetRequest(_Strict):
    """Start a new episode in an open session."""

    seed: int | None = None
    options: dict[str, Any] | None = None


class StepRequest(_Strict):
    """One action (text)."""

    action: str = Field(description="the action text; at most max_action_bytes UTF-8 bytes (else 413)")


class ResetResponse(BaseModel):
    """First observation of an episode."""

    session_id: str
    observation: Any = Field(description="the env's observation (text for agent_rl envs)")
    info: dict[str, Any] = Field(description="e.g. admissible_actions, task_type, task_id, expert_action")


class CreateSessionResponse(ResetResponse):
    """A new session's first observation, and the tools its env declares."""

    tools: list[dict[str, Any]] = Field(
        description="the env's declared tools: OpenAI-style function schemas {type: function, function: {name, "
                    "description, parameters}} (an env made with action_format=tools); [] when it declares none")


class SnapshotResponse(BaseModel):
    """A kept env-state snapshot of a session (the state stays on the server)."""

    snapshot_id: str


class RestoreRequest(_Strict):
    """Open a session in a snapshot's state."""

    session_id: str | None = Field(
        default=None, pattern=r"^[A-Za-z0-9_-]{16,64}$",
        description="id chosen by the client, as in POST /sessions; 409 session_exists if a live session of this "
                    "client has it")


class StepResponse(BaseModel):
    """gymnasium's ``step`` tuple as an object."""

    observation: Any
    reward: float
    terminated: bool = Field(description="the task ended (won or lost)")
    truncated: bool = Field(description="the turn or time budget ran out")
    info: dict[str, Any] = Field(description="e.g. won, invalid_action, admissible_actions")


class SessionInfo(BaseModel):
    """A live session as listed by ``GET /sessions``."""

    session_id: str
    env_id: str
    created_at: float = Field(description="Unix time")
    idle_s: float = Field(description="seconds since the last request")
    steps: int
    episodes: int
    done: bool = Field(description="the current episode ended; step is 409 until reset")
    busy: bool
    worker: int | None = Field(description="index of the worker process holding it")


class SessionsResponse(BaseModel):
    sessions: list[SessionInfo]


class HealthResponse(BaseModel):
    """Liveness/readiness (200 only once the server is ready). The load fields are sent only to a caller holding a
    client's token (or to every caller of a server without tokens): an unauthenticated health check gets
    ``{"status": "ok"}`` alone, so it learns no worker pid, env id or load."""

    status: str = "ok"
    env_ids: list[str] | None = None
    sessions: int | None = None
    max_sessions: int | None = None
    workers: int | None = None
    idle_workers: int | None = None
    started_workers: int | None = None
    worker_rss_mb: float | None = Field(None, description="sum of the workers' last reported RSS, MiB")
    worker_pids: list[int] | None = Field(None, description="process ids of the live workers")
    server_rss_mb: float | None = Field(None, description="RSS of the server process itself, MiB")
    expired_sessions: int | None = None


class EnvEntry(BaseModel):
    """One served env and where its other protocols are."""

    env_id: str
    openenv_path: str = Field(description="base path of its OpenEnv surface (/reset, /step, /state, /schema, "
                                          "/metadata, /health, WS /ws, the Task API): an OpenEnv client's base_url "
                                          "is the server's URL plus this")
    mcp_path: str = Field(description="its MCP endpoint (streamable HTTP)")


class EnvsResponse(BaseModel):
    env_ids: list[str]
    envs: list[EnvEntry]


class ErrorResponse(BaseModel):
    """Body of every 4xx/5xx answer except a body-validation 422 (FastAPI's list of validation errors)."""

    detail: str
    code: str = Field(description="machine-readable: session_not_found, unknown_env, episode_over, session_busy, "
                                  "action_too_large, at_capacity, env_error, env_timeout, unauthorized, body_too_large, "
                                  "invalid_json (400: the body is not JSON), json_too_deep (400: nested deeper than "
                                  "max_json_depth), "
                                  "invalid_request (422: the env rejected env_kwargs, seed or options), "
                                  "session_exists (409: a live session has the client-chosen session_id)")


class UnprocessableResponse(BaseModel):
    """Body of a 422: FastAPI's list of validation errors (malformed body, wrong types, unknown fields, invalid
    UTF-8, a lone UTF-16 surrogate in a string), or ``{"detail": str, "code": "invalid_request"}`` when the env's
    ``make``/``reset`` rejected the ``env_kwargs``, ``seed`` or ``options``."""

    detail: str | list[dict[str, Any]]
    code: str | None = Field(default=None, description="invalid_request (the env rejected the request); absent for "
                                                       "a validation error list")
