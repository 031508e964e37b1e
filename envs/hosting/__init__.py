"""Hosting gymnasium envs for many concurrent sessions, with no web framework: the core the HTTP server
(``servers/``, FastAPI routes only) and the in-process client (``agent_rl.envclient.LocalEnvPool``) share.

    manager = SessionManager(SessionSettings(env_ids=None, max_sessions=None, session_ttl_s=None))
    await manager.start()
    session_id, observation, info = await manager.create("agent_rl/Calculator-v0", options={"index": 0})
    reply = await manager.step(session_id, "answer[215]")
    await manager.aclose()

Modules: :mod:`~envs.hosting.sessions` (the session state machine), :mod:`~envs.hosting.errors` (every error it
and the pools raise), :mod:`~envs.hosting.pool` (worker processes), :mod:`~envs.hosting.threads` (threads of this
process), :mod:`~envs.hosting.placement` (which worker gets a session), :mod:`~envs.hosting.handle` (the parent side
of one worker), :mod:`~envs.hosting.child` (the env side: ops and the worker loop), :mod:`~envs.hosting.jsonable`.
"""

from envs.hosting.errors import (
    AtCapacity,
    EnvFailed,
    EnvInfraFailed,
    EnvNotReady,
    EnvRejected,
    EnvTimeout,
    EpisodeOver,
    InvalidText,
    QuotaExceeded,
    SessionBusy,
    SessionExists,
    SessionNotFound,
    SnapshotNotFound,
    UnknownEnv,
)
from envs.hosting.jsonable import lone_surrogate, scrub_text, to_jsonable
from envs.hosting.pool import StepReply, WorkerPool, env_module
from envs.hosting.sessions import Session, SessionManager, SessionSettings, Snapshot
from envs.hosting.threads import ThreadEnvPool

__all__ = [
    "AtCapacity",
    "EnvFailed",
    "EnvInfraFailed",
    "EnvNotReady",
    "EnvRejected",
    "EnvTimeout",
    "EpisodeOver",
    "InvalidText",
    "QuotaExceeded",
    "Session",
    "SessionBusy",
    "SessionExists",
    "SessionManager",
    "SessionNotFound",
    "SnapshotNotFound",
    "SessionSettings",
    "Snapshot",
    "StepReply",
    "ThreadEnvPool",
    "UnknownEnv",
    "WorkerPool",
    "env_module",
    "lone_surrogate",
    "scrub_text",
    "to_jsonable",
]
