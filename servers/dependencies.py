"""FastAPI dependencies: the session manager created in ``lifespan`` and the optional bearer token."""

from __future__ import annotations

import secrets
from typing import Annotated

from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from envs.hosting import SessionManager
from servers.sessions import ServerSettings

__all__ = ["Manager", "Settings", "get_manager", "get_settings", "require_token"]

_bearer = HTTPBearer(auto_error=False, description="set when the server was started with --token")


def get_manager(request: Request) -> SessionManager:
    """The app's :class:`SessionManager` (created in ``lifespan``)."""
    return request.app.state.manager


def get_settings(request: Request) -> ServerSettings:
    return request.app.state.settings


Manager = Annotated[SessionManager, Depends(get_manager)]
Settings = Annotated[ServerSettings, Depends(get_settings)]


def require_token(
    settings: Settings, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
) -> None:
    """401 unless the request carries ``Authorization: Bearer <token>`` (when the server has a token)."""
    if settings.token is None:
        return
    if credentials is None or not secrets.compare_digest(credentials.credentials.encode(), settings.token.encode()):
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, "missing or wrong bearer token",
                            headers={"WWW-Authenticate": "Bearer"})
