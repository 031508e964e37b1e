"""The gateway's sessions and their per-client scoping: who may reach which episode.

Each episode has its own token (``GatewaySession.api_key``, the gate's client name is the session id); the run's
token (client ``run``) reaches every session. A session's own token naming another session gets the 404 an unknown
id gets (``session_not_found``), so a program cannot learn which other sessions exist.
"""

from __future__ import annotations

import contextlib
import secrets
from dataclasses import dataclass, field
from typing import Any, Iterator

from fastapi import Request

from agent_rl.gateway.recorder import GatewaySession, RequestError
from servers.access import CLIENT_KEY

RUN_CLIENT = "run"
"""The client name of the run's own token (reaches every session)."""

MAX_AUTO_SESSIONS = 1024
"""Open sessions at most when the run's token opens them by name (more is 429 ``too_many_sessions``)."""


@dataclass
class GatewaySettings:
    """The settings ``servers.access.AccessGate`` reads: the run's token and every live session's own token."""

    token: str
    sessions: dict[str, GatewaySession] = field(default_factory=dict)
    allowed_origins: list[str] = field(default_factory=list)

    def clients(self) -> dict[str, str]:
        """``{client name: token}``: ``run`` and one entry per live session (its id)."""
        return {RUN_CLIENT: self.token, **{sid: s.api_key for sid, s in self.sessions.items() if not s.closed}}


class SessionStore:
    """The live sessions (``settings.sessions``, shared with the access gate) and which one a request reaches.

    Args:
        settings: :class:`GatewaySettings` (its ``sessions`` dict is the store).
        max_requests: each new session's model-call budget.
        auto_sessions: the run's token may open a session by naming it (``X-Session-ID``).
        session_defaults: :class:`GatewaySession` fields of sessions opened by name.
    """

    def __init__(self, settings: GatewaySettings, *, max_requests: int, auto_sessions: bool = False,
                 session_defaults: dict[str, Any] | None = None) -> None:
        self.settings = settings
        self.sessions = settings.sessions
        self.max_requests = max_requests
        self.auto_sessions = auto_sessions
        self.session_defaults = dict(session_defaults or {})

    def open(self, session_id: str | None = None, **kwargs: Any) -> GatewaySession:
        """A new episode's session (``kwargs``: :class:`GatewaySession` fields: temperature, key, ...).

        Raises:
            RequestError: 400 ``invalid_session_id`` for the reserved id ``run``; 409 ``session_exists``.
        """
        sid = session_id or secrets.token_hex(16)
        if sid == RUN_CLIENT:  # the gate's client names are the session ids and the run's own name
            raise RequestError(f"the session id {RUN_CLIENT!r} is reserved", "invalid_session_id")
        if sid in self.sessions:
            raise RequestError(f"session {sid!r} exists", "session_exists", 409)
        session = GatewaySession(session_id=sid, max_requests=self.max_requests,
                                 **{**self.session_defaults, **kwargs})
        self.sessions[sid] = session
        return session

    def close(self, session_id: str) -> GatewaySession | None:
        """End a session: its token stops working, its record is returned (None when unknown)."""
        session = self.sessions.pop(session_id, None)
        if session is not None:
            session.closed = True
        return session

    def resolve(self, request: Request, path_sid: str | None, *, open_new: bool = True) -> GatewaySession:
        """The session a request reaches: named by the URL (``path_sid``) or ``X-Session-ID``, scoped by the
        request's client (a session's own token reaches only its session); the run's token opens a named session
        when ``auto_sessions`` and ``open_new``.

        Raises:
            RequestError: 400 ``duplicate_header``, ``session_mismatch``, ``session_required``,
                ``invalid_session_id``; 404 ``session_not_found``; 429 ``too_many_sessions``.
        """
        client = request.scope.get(CLIENT_KEY)
        named = request.headers.getlist("x-session-id")
        if len(named) > 1:  # ambiguous (a proxy may read the last): refused like the gate's repeated headers
            raise RequestError("the X-Session-ID header is sent more than once (one is allowed)", "duplicate_header")
        header_sid = named[0] if named else None
        if path_sid is not None and header_sid is not None and header_sid != path_sid:
            raise RequestError("the session in the URL and the X-Session-ID header differ; send one or the same",
                               "session_mismatch")
        sid = path_sid or header_sid
        if client != RUN_CLIENT:  # a session's own token: only that session
            if sid is not None and sid != client:
                raise RequestError("session not found", "session_not_found", 404)
            sid = client
        if sid is None and client == RUN_CLIENT and self.auto_sessions:
            sid = "default"
        if sid is None:
            raise RequestError("no session: send X-Session-ID or use base_url .../sessions/<id>/v1",
                               "session_required", 400)
        session = self.sessions.get(sid)
        if session is None and client == RUN_CLIENT and self.auto_sessions and open_new:
            if len(sid) > 128 or not all(c.isalnum() or c in "-_." for c in sid):
                raise RequestError("a session id is 1-128 characters of [A-Za-z0-9_.-]", "invalid_session_id")
            if len(self.sessions) >= MAX_AUTO_SESSIONS:
                raise RequestError("too many open sessions", "too_many_sessions", 429)
            session = self.open(sid)
        if session is None or session.closed:
            raise RequestError("session not found", "session_not_found", 404)
        return session

    @contextlib.contextmanager
    def call_session(self, request: Request, path_sid: str | None) -> Iterator[GatewaySession]:
        """The session of one model call (:meth:`resolve`); one the call opened by name is closed again when the
        call is refused before it played a turn (a refused request opens nothing)."""
        known = set(self.sessions)
        session = self.resolve(request, path_sid)
        try:
            yield session
        except BaseException:
            if session.session_id not in known and not session.turns:
                self.close(session.session_id)
            raise
