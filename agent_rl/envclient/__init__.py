"""Trainer-side env clients: one async interface (:class:`EnvPool`), over HTTP (:class:`HTTPEnvPool`) or in this
process (:class:`LocalEnvPool`). The rollout orchestrator takes an ``EnvPool`` and never knows which it has."""

from agent_rl.envclient.base import (
    EnvClientError,
    EnvPool,
    EnvPoolBase,
    EnvServerError,
    EnvUnavailable,
    EpisodeOver,
    PoolCaps,
    ResetResult,
    SessionBusy,
    SessionNotFound,
    SnapshotNotFound,
    StepResult,
    pool_caps,
)
from agent_rl.envclient.http import HTTPEnvPool
from agent_rl.envclient.local import LocalEnvPool

__all__ = [
    "EnvClientError",
    "EnvPool",
    "EnvPoolBase",
    "EnvServerError",
    "EnvUnavailable",
    "EpisodeOver",
    "HTTPEnvPool",
    "LocalEnvPool",
    "PoolCaps",
    "ResetResult",
    "SessionBusy",
    "SessionNotFound",
    "SnapshotNotFound",
    "StepResult",
    "pool_caps",
]
