"""FastAPI dependencies: the session manager created in ``lifespan`` and the optional token (every surface: our
routes, OpenEnv's HTTP and WebSocket routes, MCP; :func:`token_ok`)."""

from __future__ import annotations

import base64
import binascii
import secrets
from typing import Annotated

from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from envs.hosting import SessionManager
from servers.settings import ServerSettings

__all__ = ["Manager", "Settings", "get_manager", "get_settings", "require_token", "token_ok"]

_bearer = HTTPBearer(auto_error=False, description="set when the server was started with --token")


def get_manager(request: Request) -> SessionManager:
    """The app's :class:`SessionManager` (created in ``lifespan``)."""
    return request.app.state.manager


def get_settings(request: Request) -> ServerSettings:
    return request.app.state.settings


Manager = Annotated[SessionManager, Depends(get_manager)]
Settings = Annotated[ServerSettings, Depends(get_settings)]


def token_ok(authorization: str | None, token: str | None) -> bool:
    """Whether an ``Authorization`` header value carries ``token``: ``Bearer <token>``, or HTTP Basic with
    ``<token>`` as the password (any user name; what a WebSocket client sends for a URL
    ``ws://user:<token>@host/...``, e.g. openenv-core's client, which takes no headers). Always True without a
    token. Compared in constant time."""
    if token is None:
        return True
    scheme, _, value = (authorization or "").strip().partition(" ")
    value = value.strip()
    if scheme.lower() == "basic":
        try:
            value = base64.b64decode(value, validate=True).decode("utf-8").partition(":")[2]
        except (binascii.Error, UnicodeDecodeError, ValueError):
            return False
    elif scheme.lower() != "bearer":
        return False
    return secrets.compare_digest(value.encode("utf-8", "surrogatepass"), token.encode("utf-8", "surrogatepass"))


def require_token(
    request: Request, settings: Settings,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> None:
    """401 unless the request carries the token (:func:`token_ok`: ``Authorization: Bearer <token>`` or Basic with
    the token as password) when the server has one. ``credentials`` only documents the scheme in OpenAPI."""
    if not token_ok(request.headers.get("authorization"), settings.token):
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, "missing or wrong bearer token",
                            headers={"WWW-Authenticate": "Bearer"})
