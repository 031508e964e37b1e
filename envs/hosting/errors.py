"""Every error of the env-hosting core, in one place: the worker pool's (an env failed, no room) and the session
manager's (the request is not allowed now). The HTTP server maps each to a status code (``servers.app``);
``agent_rl.envclient.LocalEnvPool`` maps each to the client error ``HTTPEnvPool`` raises for that status."""

from __future__ import annotations

from envs.errors import ENV_INFRA_ERROR_CODE

__all__ = [
    "AtCapacity",
    "EnvFailed",
    "EnvInfraFailed",
    "EnvNotReady",
    "EnvRejected",
    "EnvTimeout",
    "EpisodeOver",
    "HTTP_ERRORS",
    "SnapshotNotFound",
    "InvalidText",
    "QuotaExceeded",
    "SessionBusy",
    "SessionExists",
    "SessionNotFound",
    "UnknownEnv",
    "http_error",
]


class EnvFailed(RuntimeError):
    """The env raised, its worker died, or it did not answer in time. The session is then unusable."""


class EnvRejected(EnvFailed):
    """``make``/``reset`` raised ValueError, LookupError (KeyError, IndexError), TypeError or
    ``gymnasium.error.Error``: the request's env kwargs, seed or options are invalid (a client error, HTTP 422).
    The session is not usable either way."""


class EnvInfraFailed(EnvFailed):
    """The env raised :class:`envs.errors.EnvInfraError`: it could not judge (sandbox, verifier, game engine
    failure), which is never a reward. HTTP 500 with code ``env_infra_error``; the orchestrator retries, then drops
    the group (``docs/env_errors.md``)."""


class EnvTimeout(EnvFailed):
    """The env did not answer within the timeout; its worker was killed."""


class AtCapacity(RuntimeError):
    """No room for another session right now (live-session limit, or every worker full): retry later."""


class QuotaExceeded(AtCapacity):
    """One client holds its share already (``client_max_sessions``, ``client_max_snapshots``,
    ``client_max_workers``; the message names the quota): the server has room for other clients, not for more of
    this one's until it frees some. HTTP 503 ``quota_exceeded`` + ``Retry-After``."""


class SessionNotFound(KeyError):
    """No live session with this id (never created, closed, expired, or broken by an env failure)."""


class SnapshotNotFound(KeyError):
    """No kept snapshot with this id (never taken, dropped, expired after the TTL, or its worker ended)."""


class SessionExists(RuntimeError):
    """A live session already has the client-chosen session id."""


class UnknownEnv(KeyError):
    """The env id is not served here."""


class EpisodeOver(RuntimeError):
    """Step after the episode ended (terminated or truncated): reset the session first."""


class InvalidText(ValueError):
    """A request's text is not valid Unicode (a lone UTF-16 surrogate in the action, env id, session id, options or
    env kwargs; :func:`envs.hosting.jsonable.lone_surrogate` names where): refused before any env sees it, the
    session (if any) unchanged. HTTP 422 ``invalid_request``."""


class SessionBusy(RuntimeError):
    """Another request on the same session is still running."""


class EnvNotReady(RuntimeError):
    """A served env cannot make and reset with its defaults (missing or empty data, ...): the server refuses to
    start, so ``/health`` is never green on an env that cannot reset. The message is the env's own error, which
    names the resolved data path and the counts found."""


# The HTTP status and error code the server answers each error with (most specific class first); the in-process
# client picks its client error from the same pair, so both clients raise the same class for the same situation.
HTTP_ERRORS: list[tuple[type[Exception], int, str]] = [
    (SessionNotFound, 404, "session_not_found"),
    (SnapshotNotFound, 404, "snapshot_not_found"),
    (UnknownEnv, 404, "unknown_env"),
    (EpisodeOver, 409, "episode_over"),
    (SessionBusy, 409, "session_busy"),
    (SessionExists, 409, "session_exists"),
    (QuotaExceeded, 503, "quota_exceeded"),
    (AtCapacity, 503, "at_capacity"),
    (EnvTimeout, 504, "env_timeout"),
    (EnvInfraFailed, 500, ENV_INFRA_ERROR_CODE),
    (EnvRejected, 422, "invalid_request"),
    (InvalidText, 422, "invalid_request"),
    (EnvFailed, 500, "env_error"),
]


def http_error(exc: BaseException) -> tuple[int, str] | None:
    """``(status, code)`` the server answers ``exc`` with; ``None`` for an exception that is not a hosting error."""
    for cls, status, code in HTTP_ERRORS:
        if isinstance(exc, cls):
            return status, code
    return None
