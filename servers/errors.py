"""The one mapping from an :mod:`envs.hosting.errors` exception to what a client is told: HTTP status, error code
and message. Our routes answer it as ``{"detail", "code"}`` with the status (``servers.app``); the OpenEnv WebSocket
(``servers.openenv``) and MCP (``servers.mcp``) surfaces send the same code and message in their own envelopes, so
every surface reports one situation the same way."""

from __future__ import annotations

from envs.hosting.errors import (
    AtCapacity,
    EnvFailed,
    EnvInfraFailed,
    EnvRejected,
    EnvTimeout,
    QuotaExceeded,
    SessionNotFound,
    UnknownEnv,
    http_error,
)
from envs.hosting.jsonable import scrub_text

__all__ = ["describe_error"]


def describe_error(exc: BaseException, *, opening: bool) -> tuple[int, str, str]:
    """``(status, code, detail)`` for a hosting exception (``(500, "error", str(exc))`` for any other).

    ``opening``: the request was opening a session (an env failure then means no session was opened; otherwise the
    open session was closed). ``detail`` is valid Unicode (lone surrogates replaced, :func:`scrub_text`)."""
    status, code = http_error(exc) or (500, "error")
    if isinstance(exc, SessionNotFound):
        detail = f"no live session {exc.args[0]!r} (closed, expired or broken)"
    elif isinstance(exc, UnknownEnv):
        detail = str(exc.args[0])
    elif isinstance(exc, QuotaExceeded):
        detail = f"client quota: {exc}"
    elif isinstance(exc, AtCapacity):
        detail = f"server at capacity: {exc}"
    elif not isinstance(exc, EnvFailed):
        detail = str(exc)
    else:
        after = "no session was opened" if opening else "the session was closed"
        if isinstance(exc, EnvTimeout):
            detail = f"{exc}; {after}"
        elif isinstance(exc, EnvInfraFailed):  # the env could not judge (docs/env_errors.md): never a reward
            detail = f"the env could not judge: {exc}; {after}"
        elif isinstance(exc, EnvRejected):  # bad env_kwargs / seed / options: the client's error
            detail = f"the env rejected the request: {exc}; {after}"
        else:
            detail = f"the env raised {exc}; {after}"
    return status, code, scrub_text(detail)
