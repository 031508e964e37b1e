"""Trainer-side env clients: one async interface (:class:`EnvPool`), over HTTP (:class:`HTTPEnvPool`) or in this
process (:class:`LocalEnvPool`). The rollout orchestrator takes an ``EnvPool`` and never knows which it has."""

from agent_rl.envclient.base import (
    EnvClientError,
    EnvPool,
    EnvServerError,
    EnvUnavailable,
    EpisodeOver,
    ResetResult,
    SessionBusy,
    SessionNotFound,
    SnapshotNotFound,
    StepResult,
)
from agent_rl.envclient.http import HTTPEnvPool
from agent_rl.envclient.local import LocalEnvPool

__all__ = [
    "EnvClientError",
    "EnvPool",
    "EnvServerError",
    "EnvUnavailable",
    "EpisodeOver",
    "HTTPEnvPool",
    "LocalEnvPool",
    "ResetResult",
    "SessionBusy",
    "SessionNotFound",
    "SnapshotNotFound",
    "StepResult",
]
