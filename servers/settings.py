"""The server's settings: the session manager's (:class:`envs.hosting.sessions.SessionSettings`) plus what only
HTTP has (bearer token, body limits, ``Retry-After``). Sessions, workers and their errors live in
:mod:`envs.hosting`, shared with ``agent_rl.envclient.LocalEnvPool``."""

from __future__ import annotations

from dataclasses import dataclass, field

from envs.data import PATH_KWARGS, PATH_OPTIONS
from envs.hosting.sessions import SessionSettings
from servers.tokens import DEFAULT_CLIENT, check_tokens
from envs.jsondepth import MAX_JSON_DEPTH

__all__ = ["ServerSettings"]


@dataclass
class ServerSettings(SessionSettings):
    """Everything ``create_app`` is configured with (one place; ``GET /health`` reports it)."""

    env_ids: list[str]  # type: ignore[assignment]  (a server always names the ids it serves)
    token: str | None = None
    """The token of one client (named ``default``), required on every route but the health checks (``None`` and no
    ``tokens``: no token, loopback only; ``servers.access``)."""
    tokens: dict[str, str] | None = None
    """``{client name: token}`` (``--token-file``): clients told apart by their tokens, each owning its sessions."""
    allowed_origins: list[str] = field(default_factory=list)
    """Browser origins allowed beside the server's own (``--allow-origin``; ``"*"``: any)."""
    max_action_bytes: int = 64 * 1024
    """Largest action (UTF-8 bytes) accepted; larger is 413."""
    max_json_depth: int = MAX_JSON_DEPTH
    """Deepest JSON nesting of a request body or WebSocket message (400 ``json_too_deep`` beyond, before parsing)."""
    refused_env_kwargs: tuple[str, ...] = PATH_KWARGS
    """Env kwargs clients may not send (host paths: where the data lives is the server's choice)."""
    refused_options: tuple[str, ...] = PATH_OPTIONS
    """Reset options clients may not send (host paths: ALFWorld's ``gamefile``)."""
    client_max_new_tasks: int | None = 256
    """Tasks one client's resets may generate within ``new_tasks_window_s`` (``SessionSettings``)."""
    max_mcp_sessions: int | None = None
    """MCP transport sessions (``Mcp-Session-Id``) of each env's MCP surface at most (the SDK answers 503 beyond),
    each client at most its share (503 ``quota_exceeded``); ``None``: ``max_sessions`` (an MCP session plays one
    episode at a time)."""
    retry_after_s: int = 1
    """``Retry-After`` seconds sent with 503."""

    _kind = "server settings"
    _rules = ("max_sessions, max_sessions_per_worker, max_action_bytes >= 1; workers, prestart_workers >= 0; "
              "ttl, env_timeout > 0")

    def invalid(self) -> list[str]:
        """``name=value`` of every setting the server could not run with."""
        bad = super().invalid()
        if self.max_sessions is None:
            bad.insert(0, "max_sessions=None")
        if self.session_ttl_s is None:
            bad.append("session_ttl_s=None")
        if self.max_json_depth < 1:
            bad.append(f"max_json_depth={self.max_json_depth!r}")
        if self.max_mcp_sessions is not None and self.max_mcp_sessions < 1:
            bad.append(f"max_mcp_sessions={self.max_mcp_sessions!r}")
        if self.max_action_bytes < 1:
            bad.append(f"max_action_bytes={self.max_action_bytes!r}")
        if self.token is not None and self.tokens:
            bad.append("token and tokens both set (one --token or one --token-file)")
        else:
            bad += check_tokens(self.clients() if self.token is not None or self.tokens is not None else {})
            if self.tokens is not None and not self.tokens:
                bad.append("tokens={} (no client)")
        return bad

    def mcp_sessions_cap(self) -> int:
        """:attr:`max_mcp_sessions`, or ``max_sessions`` when unset."""
        return self.max_mcp_sessions or self.max_sessions or 64

    def client_count(self) -> int:
        """The clients the per-client quotas share the pools among (one without tokens or with one token)."""
        return max(1, len(self.clients()))

    def clients(self) -> dict[str, str]:
        """``{client name: token}``; ``{}``: no token (one client, ``servers.tokens.LOCAL_CLIENT``)."""
        if self.token is not None:
            return {DEFAULT_CLIENT: self.token}
        return dict(self.tokens or {})

    @property
    def max_body_bytes(self) -> int:
        """Largest request body: the action limit plus room for JSON escaping and the other fields."""
        return 6 * self.max_action_bytes + 64 * 1024
