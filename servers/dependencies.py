"""FastAPI dependencies: the session manager created in ``lifespan``, the settings, and the caller's client with
its own sessions (``servers.access``: the gate in front of every surface authenticates the caller; a route reaches
sessions only through :class:`~servers.access.ClientSessions`)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from envs.hosting import SessionManager
from servers.access import CLIENT_KEY, ClientSessions
from servers.settings import ServerSettings

__all__ = ["Client", "Manager", "Sessions", "Settings", "client_sessions", "get_client", "get_manager",
           "get_settings"]

_bearer = HTTPBearer(auto_error=False, description="set when the server was started with --token or --token-file")


def get_manager(request: Request) -> SessionManager:
    """The app's :class:`SessionManager` (created in ``lifespan``)."""
    return request.app.state.manager


def get_settings(request: Request) -> ServerSettings:
    return request.app.state.settings


def get_client(request: Request,
               credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]) -> str:
    """The caller's client name, as :class:`servers.access.AccessGate` authenticated it (401 if the gate did not:
    a route is never served to an unknown caller). ``credentials`` only documents the scheme in OpenAPI."""
    client = request.scope.get(CLIENT_KEY)
    if client is None:
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, "missing or wrong token",
                            headers={"WWW-Authenticate": "Bearer"})
    return client


def client_sessions(request: Request, client: Annotated[str, Depends(get_client)]) -> ClientSessions:
    """The caller's sessions (any served env)."""
    return ClientSessions(get_manager(request), client)


Manager = Annotated[SessionManager, Depends(get_manager)]
Settings = Annotated[ServerSettings, Depends(get_settings)]
Client = Annotated[str, Depends(get_client)]
Sessions = Annotated[ClientSessions, Depends(client_sessions)]
