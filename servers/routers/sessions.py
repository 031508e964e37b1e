"""Session routes. Each one validates the request, calls the caller's sessions (``servers.access.ClientSessions``:
another client's session is 404 ``session_not_found``, untouched), and serialises the result; errors are raised as
exceptions that ``servers.app`` maps to HTTP codes."""

from __future__ import annotations

import contextlib
import time

from fastapi import APIRouter, HTTPException, Response, status

from envs.hosting import SessionNotFound
from servers.dependencies import Sessions, Settings
from servers.schemas import (
    CreateSessionRequest,
    CreateSessionResponse,
    ErrorResponse,
    ResetRequest,
    ResetResponse,
    RestoreRequest,
    SessionInfo,
    SessionsResponse,
    StepRequest,
    SnapshotResponse,
    StepResponse,
    UnprocessableResponse,
)

router = APIRouter(prefix="/sessions", tags=["sessions"])
snapshots_router = APIRouter(prefix="/snapshots", tags=["snapshots"])

_E = {"model": ErrorResponse}
_422 = {"model": UnprocessableResponse, "description": "validation errors, or the env rejected the request"}


@router.post("", response_model=CreateSessionResponse, status_code=status.HTTP_201_CREATED,
             responses={404: _E, 409: _E, 422: _422, 500: _E, 503: _E, 504: _E})
async def create_session(body: CreateSessionRequest, sessions: Sessions) -> CreateSessionResponse:
    """Open a session on ``env_id`` and return its first observation and the env's declared ``tools`` (409 if the
    client-chosen ``session_id`` is taken by a live session)."""
    session_id, observation, info = await sessions.create(
        body.env_id, seed=body.seed, options=body.options, env_kwargs=body.env_kwargs, session_id=body.session_id
    )
    try:
        tools = await sessions.info(session_id, "tools")
    except BaseException:  # the env's tools attribute is broken (or the request was cancelled): no session kept
        with contextlib.suppress(SessionNotFound):
            await sessions.close(session_id)
        raise
    return CreateSessionResponse(session_id=session_id, observation=observation, info=info, tools=tools)


@router.get("", response_model=SessionsResponse)
async def list_sessions(sessions: Sessions) -> SessionsResponse:
    """The caller's live sessions (every surface's: a WebSocket's and MCP's too), no other client's."""
    now = time.monotonic()
    pool = sessions.manager.pool
    return SessionsResponse(sessions=[
        SessionInfo(session_id=sid, env_id=s.env_id, created_at=s.created_at, idle_s=now - s.last_used,
                    steps=s.steps, episodes=s.episodes, done=s.done, busy=s.busy, worker=pool.worker_of(s.session_id))
        for sid, s in sessions.list()
    ])


@router.post("/{session_id}/step", response_model=StepResponse,
             responses={404: _E, 409: _E, 413: _E, 500: _E, 504: _E})
async def step(session_id: str, body: StepRequest, sessions: Sessions, settings: Settings) -> StepResponse:
    """``env.step(action)``. 409 after the episode ended or while another request runs on this session."""
    if len(body.action.encode("utf-8", errors="surrogatepass")) > settings.max_action_bytes:
        raise HTTPException(413,
                            f"action longer than max_action_bytes={settings.max_action_bytes}")
    reply = await sessions.step(session_id, body.action)
    return StepResponse(observation=reply.observation, reward=reply.reward, terminated=reply.terminated,
                        truncated=reply.truncated, info=reply.info)


@router.post("/{session_id}/reset", response_model=ResetResponse,
             responses={404: _E, 409: _E, 422: _422, 500: _E, 504: _E})
async def reset(session_id: str, body: ResetRequest, sessions: Sessions) -> ResetResponse:
    """Start a new episode in the same session (same env instance)."""
    observation, info = await sessions.reset(session_id, seed=body.seed, options=body.options)
    return ResetResponse(session_id=session_id, observation=observation, info=info)


@router.delete("/{session_id}", status_code=status.HTTP_204_NO_CONTENT, responses={404: _E})
async def close(session_id: str, sessions: Sessions) -> Response:
    """Close the session and free its env."""
    await sessions.close(session_id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.post("/{session_id}/snapshot", response_model=SnapshotResponse, status_code=status.HTTP_201_CREATED,
             responses={404: _E, 409: _E, 422: _422, 500: _E, 503: _E, 504: _E})
async def snapshot(session_id: str, sessions: Sessions) -> SnapshotResponse:
    """Keep the session's env state (the env's ``clone_state()``) on the server, its episode untouched: forked
    groups by state copy. 422 when the env has no ``clone_state``/``set_state``, 409 after the episode ended, 503 at
    ``max_snapshots``. Only this client may restore or drop it; it expires after the session TTL unused."""
    return SnapshotResponse(snapshot_id=await sessions.snapshot(session_id))


@snapshots_router.post("/{snapshot_id}/restore", response_model=CreateSessionResponse,
                       status_code=status.HTTP_201_CREATED, responses={404: _E, 409: _E, 500: _E, 503: _E, 504: _E})
async def restore(snapshot_id: str, body: RestoreRequest, sessions: Sessions) -> CreateSessionResponse:
    """Open a new session in the snapshot's state (observation and info: the source's last when it was taken)."""
    session_id, observation, info = await sessions.restore(snapshot_id, session_id=body.session_id)
    try:
        tools = await sessions.info(session_id, "tools")
    except BaseException:
        with contextlib.suppress(SessionNotFound):
            await sessions.close(session_id)
        raise
    return CreateSessionResponse(session_id=session_id, observation=observation, info=info, tools=tools)


@snapshots_router.delete("/{snapshot_id}", status_code=status.HTTP_204_NO_CONTENT, responses={404: _E})
async def drop_snapshot(snapshot_id: str, sessions: Sessions) -> Response:
    """Free the snapshot."""
    await sessions.drop_snapshot(snapshot_id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
