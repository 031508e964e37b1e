"""The env-pool interface the rollout orchestrator programs against (HTTP or in-process, it never knows which).

    pool: EnvPool = HTTPEnvPool(["http://127.0.0.1:8001"])   # or LocalEnvPool(max_workers=8)
    r = await pool.reset("agent_rl/ALFWorld-v0", options={"split": "valid_unseen", "index": 0})
    s = await pool.step(r.session_id, "go to desk 1")
    await pool.close(r.session_id)
    await pool.aclose()

``reset`` opens a new session (a fresh episode) each time; ``close`` frees it. Observations are text and ``info``
is JSON (str, int, float, bool, None, list, dict) in both implementations.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

__all__ = [
    "EnvClientError",
    "EnvPool",
    "EnvServerError",
    "EnvUnavailable",
    "EpisodeOver",
    "ResetResult",
    "SessionBusy",
    "SessionNotFound",
    "SnapshotNotFound",
    "StepResult",
    "client_error",
]


@dataclass
class ResetResult:
    """First observation of a new session's episode."""

    session_id: str
    observation: Any
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class StepResult:
    """gymnasium's ``step`` tuple: ``terminated`` = the task ended, ``truncated`` = the turn budget ran out."""

    observation: Any
    reward: float
    terminated: bool
    truncated: bool
    info: dict[str, Any] = field(default_factory=dict)


class EnvClientError(Exception):
    """Base of every env-pool error. ``status`` is the HTTP status (``None`` in-process), ``code`` the server's
    machine-readable error code when there is one."""

    def __init__(self, message: str, *, status: int | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


class SessionNotFound(EnvClientError):
    """The session does not exist (closed, expired after the server's TTL, or broken by an env failure)."""


class SnapshotNotFound(EnvClientError):
    """The env-state snapshot does not exist (dropped, expired after the server's TTL, or its worker ended)."""


class EpisodeOver(EnvClientError):
    """Step after the episode ended (terminated or truncated)."""


class SessionBusy(EnvClientError):
    """Another request on the same session is still running (the pool never queues two on one session)."""


class EnvServerError(EnvClientError):
    """The env raised or timed out (the session is gone), or the server failed mid-request."""


class EnvUnavailable(EnvClientError):
    """No server could take the request after the retries (connection refused, 503 at capacity, pool timeout)."""


def client_error(message: str, *, status: int, code: str | None, session_route: bool,
                 in_process: bool = False) -> EnvClientError:
    """The error a pool raises for a server answer ``status`` + ``code`` (one rule for ``HTTPEnvPool`` and
    ``LocalEnvPool``, so both raise the same class for the same situation).

    Args:
        session_route: the request named a session (``/sessions/{id}/...``): a 404 is then ``SessionNotFound``.
        in_process: no HTTP was involved: the error's ``status`` is ``None``.
    """
    if status == 404 and code == "snapshot_not_found":
        cls: type[EnvClientError] = SnapshotNotFound
    elif status == 404 and code != "unknown_env" and session_route:
        cls = SessionNotFound
    elif status == 409:
        cls = SessionBusy if code == "session_busy" else EpisodeOver
    elif status == 503:
        cls = EnvUnavailable
    elif status >= 500:
        cls = EnvServerError
    else:
        cls = EnvClientError
    return cls(message, status=None if in_process else status, code=code)


@runtime_checkable
class EnvPool(Protocol):
    """Async sessions of gymnasium text envs."""

    async def reset(
        self,
        env_id: str,
        *,
        seed: int | None = None,
        options: dict[str, Any] | None = None,
        env_kwargs: dict[str, Any] | None = None,
    ) -> ResetResult:
        """Open a session: ``gymnasium.make(env_id, **env_kwargs).reset(seed=seed, options=options)``."""
        ...

    async def step(self, session_id: str, action: str) -> StepResult:
        """``env.step(action)``; raises ``SessionNotFound``, ``EpisodeOver``, ``SessionBusy``, ``EnvServerError``."""
        ...

    async def close(self, session_id: str) -> None:
        """Free the session (idempotent: closing an unknown or expired session is not an error)."""
        ...

    # Optional, declared by ``caps.snapshots`` (:class:`PoolCaps`; both pools of this package have them): env-state
    # snapshots, for an env whose unwrapped class has ``clone_state()``/``set_state(state)`` (forked groups,
    # ``rollout.fork.restore=state``). The state never leaves the process that holds the env; a snapshot is named by
    # an id.
    #   async def snapshot(self, session_id: str) -> str: keep the session's current state -> snapshot id
    #       (EnvClientError code "invalid_request" when the env has no clone_state/set_state; EpisodeOver after the
    #       episode ended)
    #   async def restore(self, snapshot_id: str) -> ResetResult: a new session in that state (its observation and
    #       info: the source's last); SnapshotNotFound
    #   async def drop_snapshot(self, snapshot_id: str) -> None: free it (idempotent)

    async def aclose(self) -> None:
        """Close every session this pool opened and release its resources."""
        ...


@dataclass(frozen=True)
class PoolCaps:
    """What an env pool can do beyond ``reset``/``step``/``close``/``aclose``, declared on its class
    (:class:`EnvPoolBase`) and read by the rollout instead of probing the pool object.

    Attributes:
        snapshots: ``snapshot(session_id)``, ``restore(snapshot_id)`` and ``drop_snapshot(snapshot_id)`` (the
            :class:`EnvPool` comments; forked groups by state copy, ``rollout.fork.restore=state``).
    """

    snapshots: bool = False


class EnvPoolBase:
    """Base class of the env pools: their declared :class:`PoolCaps` (class attribute ``caps``)."""

    caps: PoolCaps = PoolCaps()


def pool_caps(pool: Any) -> PoolCaps:
    """The capabilities of an env pool object: its declared ``caps`` (an :class:`EnvPoolBase`), else none beyond
    the :class:`EnvPool` protocol (a duck-typed pool, e.g. a test's fake)."""
    return pool.caps if isinstance(pool, EnvPoolBase) else PoolCaps()
